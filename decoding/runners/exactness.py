"""How wide a verify forward may be and stay lossless, measured on the runner that will serve.

Drafting is lossless only if every row of a k-token forward is bit-identical to the one-token step
at that position: a near-tie between two tokens flips on the smallest difference. Whether it is
depends on kernels, not on the model's maths (a float GEMM picks other code paths for other row
counts; llama.cpp switches kernels with the batch size), so it is measured: at a few cache
positions (short, mid, near the runner's limit), forwards of every width the engine uses are
compared with as many one-token steps. `exact_width` is the widest width up to which all of them
matched; drafts are capped one token below it (1: no drafting). Results are kept in
$DRAFTWISE_HOME, keyed by model, format, forward path, device and a hash of the probe's code, so
later starts measure nothing; two starting together probe once (decoding/home/cache_files.py).
"""
from __future__ import annotations

import functools
import logging

import torch

from decoding.home import cache_files, paths
from decoding.runners.base import synthetic_tokens

log = logging.getLogger(__name__)

MAX_WIDTH = 17  # a 16-token draft plus the target's own token (CostModel.max_draft + 1)
CACHE_FILE = "exactness.json"


def positions(limit: int, widest: int = MAX_WIDTH, resizes: bool = False) -> list[int]:
    """Where to probe: a short cache, a mid one, and one near the runner's limit. Where the cache
    cannot grow (llama.cpp's context) the widest forward probed there still fits. Where it grows
    (the static forward's KV buffer, `resizes`) that position is the buffer's last one, so every
    verify forward probed there crosses a resize of the buffer, as a request's does once its sequence
    outgrows it (and the one-token steps it is compared with cross it at their second step)."""
    near = limit - 1 if resizes else limit - widest - 2
    return sorted({p for p in (40, min(512, near), near) if 0 < p <= near})


def code_tokens(runner, n: int) -> list[int]:
    """n tokens of real code (this package's own source) in the runner's vocabulary: whether a row
    is exact can depend on the values it computes, and code is what it will compute. Synthetic
    tokens where the runner has no tokenizer."""
    from pathlib import Path

    tokenizer = getattr(getattr(runner, "loaded", None), "tokenizer", None)
    if tokenizer is None:
        return synthetic_tokens(runner.vocab_size, n)
    ids: list[int] = []
    for source in sorted(Path(__file__).parents[1].rglob("*.py")):
        ids += [t for t in tokenizer(source.read_text(encoding="utf-8"))["input_ids"] if t < runner.vocab_size]
        if len(ids) >= n:
            return ids[:n]
    return (ids + synthetic_tokens(runner.vocab_size, n))[:n]


def probe(runner, widths: range | None = None, limit: int | None = None) -> dict:
    """Compare k-token forwards with k one-token steps: every width a verify forward can have (a
    draft plus the target's token, and on a request's first forward the prompt's unread tail).
    Returns {"exact_width", "max_difference" (beyond exact_width), "per_width": {width: largest
    difference}, "positions"}."""
    widths = widths or range(2, MAX_WIDTH + runner.prompt_tail)
    limit = limit or getattr(runner, "max_positions", 2048)
    where = positions(limit, max(widths), getattr(runner, "resizes", False))
    ids = code_tokens(runner, max(where) + max(widths) + 1)
    per_width: dict[int, float] = {w: 0.0 for w in widths}
    assumes = hasattr(runner, "assume_cached")

    def cached(pos: int) -> None:  # the rows compared read the same cache, whatever it holds
        if assumes:  # (and a buffer the last forward grew is back to its size)
            runner.assume_cached(ids[:pos])
        else:
            runner.crop_to(pos)

    runner.start([], "__exactness__")
    try:
        for pos in where:
            if assumes:
                cached(pos)
            else:
                runner.sync(ids[:pos + 1])  # the cache holds ids[:pos]
            steps = torch.cat([runner.forward([t]) for t in ids[pos:pos + max(widths)]])
            cached(pos)
            for w in widths:
                rows = runner.forward(ids[pos:pos + w])
                cached(pos)
                if not torch.equal(rows, steps[:w]):  # NaN never counts as equal
                    diff = float((rows - steps[:w]).abs().nan_to_num(nan=float("inf")).max())
                    per_width[w] = max(per_width[w], diff if diff > 0 else float("inf"))
    finally:
        if assumes:  # a first start leaves the buffer the size later starts have
            runner.assume_cached([])
        runner.discard()
    exact = 1
    for w in widths:
        if per_width[w] != 0.0:
            break
        exact = w
    beyond = max((d for w, d in per_width.items() if w > exact), default=0.0)
    return {"exact_width": exact, "max_difference": beyond, "per_width": per_width, "positions": where}


@functools.lru_cache(maxsize=1)
def _probe_code(code: tuple = (probe, positions, code_tokens)) -> str:
    """A verdict of another probe's code is never read."""
    return cache_files.code_hash(*code)


def _key(runner) -> str | None:
    from decoding.models.checkpoint import device_key
    from decoding.models.specs import model_key
    from decoding.models.weights import implementation

    loaded = runner.loaded
    if loaded.spec is None:
        return None
    return (f"probe {_probe_code()} | {model_key(loaded.spec)} | {implementation(loaded.weights)} | "
            f"{getattr(runner, 'path', 'eager')} | "
            f"{device_key(loaded.device)}")


def _kept_or_probed(runner, key: str | None) -> tuple[dict, bool]:
    """The kept verdict, else a probe's (kept for later starts; a start probing the same key meanwhile
    is waited for, not probed again). Returns (verdict, probed here)."""
    if key is None:
        return probe(runner), True

    def whole(kept) -> bool:  # an entry written by another version is probed again
        return int(kept["exact_width"]) >= 1 and float(kept["max_difference"]) >= 0 and "positions" in kept

    return cache_files.kept_or_measured(paths.draftwise_home() / CACHE_FILE, key, lambda: probe(runner),
                                        "exactness", valid=whole)


def measure(runner) -> dict:
    """Set runner.exact_width (and verify_difference) from the kept result or a new probe."""
    key = _key(runner)
    result, probed = _kept_or_probed(runner, key)
    if probed:
        log.info("exactness probe (%s): exact up to %d rows at positions %s; beyond: %.3g",
                 key, result["exact_width"], result["positions"], result["max_difference"])
    runner.exact_width = int(result["exact_width"])
    runner.verify_difference = float(result["max_difference"])
    decide(runner, result)
    runner.exactness = result
    # The first forward reads the prompt's tail and a draft: together no wider than the exact width.
    runner.prompt_tail = max(1, min(runner.prompt_tail, runner.exact_width - (MAX_WIDTH - 1)))
    return result


# what draftwise/stats says of a runner that drafts (`exact_how`)
BY_CONSTRUCTION = "by construction"
AS_PROBED = "exact as probed, not by construction"


def decide(runner, result: dict) -> None:
    """Whether the probe's widths may draft, and why (runner.exact_how, runner.not_exact_why).
    By construction: every op of the forward that runs computes a row alike at any width (the static
    forward on integer kernels and row_ops.cpp: decoding/runners/static.py says where it is not).
    Anything else drafts on no CPU, where such a forward passed the probe and then changed a text
    (transformers' bf16 on the tiny model): the probe sees a few prompts and positions, not every one.
    Elsewhere (CUDA, MPS) its widths draft, and stats and the log say they are exact as probed."""
    if runner.exact_width < 2:
        return
    if runner.exact_by_construction:
        runner.exact_how = BY_CONSTRUCTION
        return
    why = getattr(runner, "not_by_construction", None) or "float matmuls, whose kernels BLAS or llama.cpp picks by the number of rows"
    probed = f"widths up to {runner.exact_width} at positions {result['positions']}"
    if runner.device.type == "cpu":
        runner.not_exact_why = (f"this forward is not exact by construction: {why}; the probe found {probed} "
                                "exact, but other prompts and positions can differ")
        runner.exact_width = 1
        return
    runner.exact_how = f"{AS_PROBED} ({probed}; {why})"
    log.warning("drafting on %s verify forwards %s", runner.loaded.weights, runner.exact_how)
