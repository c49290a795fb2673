"""`target: auto` (the default): the larger preset where this machine runs it within the latency goals, else
the smaller.

The 1.5B writes the right first line far more often than the 0.5B (docs/performance.md, the 1.5B), at about three
times the cost a token. It is chosen when all of these hold, and the 0.5B otherwise:
- it is pulled (`draftwise models pull`; a start never downloads a gigabyte on its own);
- the memory it needs is well inside what is free (twice its resident size);
- on a GPU it always runs fast enough; on a CPU the integer kernels run here (not the portable path),
  and the int4 forward this machine would run reads a prompt and takes a decode step within the goals:
  READ_TOK_S (a 1,500-token prompt read ahead within the few seconds after opening a file) and STEP_MS
  (typing along stays at a suggestion every ~100 ms).
The speeds are measured once on this machine, on the 1.5B's own layer shapes with synthetic weights
(a second or so, before any model is loaded), and kept in $DRAFTWISE_HOME with the kernel's code and
the CPU: later starts read them.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from decoding.home import cache_files, paths

log = logging.getLogger(__name__)

AUTO = "auto"
LARGER, SMALLER = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
READ_TOK_S = 400.0  # prompt tokens a second the larger model must read at
STEP_MS = 80.0  # the longest decode step it may take
RESIDENT_GIB = 1.5  # draftwise serve with the 1.5B at int4 (docs/performance.md, memory)
# The 1.5B's linear layers as the static forward runs them: (outputs, inputs) per layer (q, k and v in
# one, gate and up in one: decoding/models/static_decoder.py), and how many layers
LAYER_SHAPES = ((2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960))
LAYERS = 28
LM_HEAD = (151936, 1536)  # int8 in both quantized formats: read once a decode step
# the share of a forward's time outside its linear layers (attention, norms, rotary), measured on the
# static forward of the 1.5B at int4 (a 256-token chunk at position 1,024)
OTHER_OPS = 0.2
RECORD = "target-choice.json"
FLUSH_BYTES = 256 * 2**20  # a stack of layers larger than any CPU's last-level cache


@dataclass(frozen=True)
class TargetChoice:
    spec: str
    reason: str
    measured: dict | None = None


def choose_target(target: str, device: str = "auto") -> TargetChoice:
    """The model spec a start loads for `target` (itself unless it is `auto`), and why."""
    if target != AUTO:
        return TargetChoice(target, "asked for")
    from decoding.models import pack
    from decoding.models.specs import PRESETS

    if not pack.is_pulled(PRESETS[LARGER]):
        return TargetChoice(SMALLER, f"{LARGER} is not pulled (`draftwise models pull {LARGER}` to have it chosen "
                                     f"where it runs fast enough)")
    free = _free_gib()
    if free is not None and free < 2 * RESIDENT_GIB:
        return TargetChoice(SMALLER, f"{free:.1f} GiB of memory free: {LARGER} needs about {RESIDENT_GIB:g} GiB")
    from decoding.models.checkpoint import resolve_device

    dev, _ = resolve_device(device, "auto")
    if dev.type != "cpu":
        return TargetChoice(LARGER, f"{dev.type} device")
    try:
        speed = measured_speed()
    except Exception as exc:  # noqa: BLE001 - a failed measurement never fails a start: the smaller model
        log.warning("measuring %s's speed failed (%s): %s chosen", LARGER, exc, SMALLER)
        return TargetChoice(SMALLER, f"measuring {LARGER}'s speed on this CPU failed: {exc}")
    if speed is None:
        return TargetChoice(SMALLER, "draftwise's integer kernels do not run here: the portable path is too slow "
                                     f"for {LARGER}")
    fast = speed["read_tok_s"] >= READ_TOK_S and speed["step_ms"] <= STEP_MS
    reason = (f"{LARGER} on this CPU: reads {speed['read_tok_s']:.0f} prompt tokens/s (goal {READ_TOK_S:.0f}), "
              f"a decode step {speed['step_ms']:.0f} ms (goal {STEP_MS:.0f})")
    return TargetChoice(LARGER if fast else SMALLER, reason if fast else reason + ": too slow", speed)


def _free_gib() -> float | None:
    try:
        import psutil
    except ImportError:
        return None
    return psutil.virtual_memory().available / 2**30


def measured_speed() -> dict | None:
    """The larger model's int4 forward on this CPU, estimated from its layers: {"read_tok_s", "step_ms"};
    None where the kernels do not run. Kept per CPU, threads and kernel code."""
    import torch

    from decoding.kernels import integer_linear
    from decoding.models.checkpoint import device_key
    from decoding.models.weights import implementation

    if not integer_linear.load():
        return None
    shapes = (LAYER_SHAPES, LAYERS, LM_HEAD, OTHER_OPS, FLUSH_BYTES)  # what the estimate is made of: a change measures again
    key = f"{device_key(torch.device('cpu'))} | {implementation('int4')} | " \
          f"{cache_files.code_hash(_measure, _best, extra=repr(shapes))}"
    value, _ = cache_files.kept_or_measured(paths.draftwise_home() / RECORD, key, _measure,
                                            f"{LARGER}'s speed on this CPU",
                                            valid=lambda v: v["read_tok_s"] > 0 and v["step_ms"] > 0)
    return value


def _measure(rows: int = 256, repeats: int = 3) -> dict:
    """Synthetic int4 weights of the 1.5B's shapes on the int4 kernel: a prompt chunk of `rows` through
    each shape, and one-row steps through a stack of layers larger than any cache (a step streams the
    model's weights from memory, as a real one does), the best of `repeats` each; a step also reads the
    int8 lm_head (a prompt's chunk computes logits for its last row only)."""
    import torch

    def layer(n: int, k: int) -> tuple:  # the values do not change the kernel's time
        return (torch.full((n // 16, k // 8, 64), 0x5A, dtype=torch.uint8),
                torch.full((n // 16, k // 32, 16), 0.01, dtype=torch.half), torch.zeros(n // 16, k // 32, 16).half())

    chunk = 0.0
    with torch.inference_mode():
        for n, k in dict.fromkeys(LAYER_SHAPES):  # a shape once; how often it comes is counted below
            weights, many = layer(n, k), torch.randn(rows, k)
            chunk += LAYER_SHAPES.count((n, k)) * _best(lambda: torch.ops.draftwise.q4_linear(many, *weights, 32),
                                                        repeats)
        layer_bytes = sum(n * k // 2 for n, k in LAYER_SHAPES)
        stack = [[layer(n, k) for n, k in LAYER_SHAPES] for _ in range(max(1, FLUSH_BYTES // layer_bytes))]
        ones = {k: torch.randn(1, k) for _, k in LAYER_SHAPES}

        def steps():
            for linears in stack:
                for (n, k), weights in zip(LAYER_SHAPES, linears):
                    torch.ops.draftwise.q4_linear(ones[k], *weights, 32)

        step = _best(steps, repeats * 3) * LAYERS / len(stack)  # a pass is ~20 ms: more tries, less noise
        del stack
        (n, k), row = LM_HEAD, torch.randn(1, LM_HEAD[1])  # the int8 kernel in the lm_head's layout
        head = (torch.ones(n // 16, k // 4, 64, dtype=torch.int8), torch.full((n,), k, dtype=torch.int32),
                torch.full((n,), 0.01))
        head_step = _best(lambda: torch.ops.draftwise.q8_linear(row, *head), repeats * 3)
    # a chunk's other ops (attention over its rows, norms) are OTHER_OPS of its time; one row's are
    # small beside streaming the weights
    forward, decode = chunk * LAYERS / (1 - OTHER_OPS), step + head_step
    return {"read_tok_s": round(rows / forward, 1), "step_ms": round(decode * 1000, 1)}


def _best(fn, repeats: int) -> float:
    fn()  # warm: the kernel's threads up (and a chunk's weights into cache, as they are mid-chunk)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best
