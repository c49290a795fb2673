"""`--weights auto`: the fastest format whose quality passes the gate, measured on this device.

CUDA gets bf16. On a CPU every eligible format is timed on the requests users wait for (WORKLOADS
below: mostly requests while typing, some cold), a quantized one on a stand-in with the model's shapes
and zeros for weights, so only the winner is quantized; the timings are kept in
$DRAFTWISE_HOME, keyed by model, CPU, torch version, thread count and the code that runs and times
each format, so later starts only load the winner. Two starts of one model together time it once: the
second waits for the first's timings. A format whose kernel is missing or fails gives one log line
and the next format.
"""
from __future__ import annotations

import functools
import gc
import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from decoding.errors import DraftwiseError
from decoding.home import cache_files, paths
from decoding.models import quality_gate
from decoding.models.checkpoint import device_key
from decoding.models.specs import model_key
from decoding.models.weights import FORMATS, implementation, kernel_problem, quantization_measured

log = logging.getLogger(__name__)

# What a format is timed on: the requests users wait for. Most come while typing: the stored cache
# holds the prompt up to the edit, so a request reads ~80 tokens again (the edited line's tail, the
# suffix section after it) and generates a line or two (24 tokens). The rest start cold (a file just
# opened): a 1,000-token prompt and 48 new tokens. The shares weigh them as the typing replay sees
# them (README, "What typing feels like"): a format that reads cold prompts fast but decodes slowly
# loses where users wait. Drafting verifies five tokens a forward and keeps 2.5 (middling for code).
WORKLOADS = {"typing": {"prompt_tokens": 80, "new_tokens": 24, "share": 0.9},
             "cold": {"prompt_tokens": 1000, "new_tokens": 48, "share": 0.1}}
REFERENCE = {"verify_tokens": 5, "tokens_per_forward": 2.5}
# Timed formats in this order; the last one timed stays loaded, so the usual winner goes last.
TIMING_ORDER = ("fp32", "bf16", "gguf", "int8", "int4")
CACHE_FILE = "weight-timings.json"
# Formats whose reference times differ by less than this are as fast as each other: the timing of one
# load varies about as much here (int8 0.65 s against int4 0.70 s in one start, the reverse in another).
SAME_SPEED = 0.10


@dataclass
class FormatTiming:
    decode_ms: float  # one new token over a 128-token cache
    verify_ms: float  # REFERENCE["verify_tokens"] new tokens in one forward
    prefill_tok_s: float  # a 256-token prompt chunk
    drafts: bool = True  # False: its verify forwards are not row-exact by construction, so it decodes plainly

    def request_s(self, prompt_tokens: int, new_tokens: int) -> float:
        """Reading prompt_tokens and generating new_tokens, drafting where this format may."""
        generate_ms = (new_tokens * self.decode_ms if not self.drafts
                       else new_tokens / REFERENCE["tokens_per_forward"] * self.verify_ms)
        return prompt_tokens / self.prefill_tok_s + generate_ms / 1000

    @property
    def reference_s(self) -> float:
        """The wait for an average request of WORKLOADS."""
        return sum(w["share"] * self.request_s(w["prompt_tokens"], w["new_tokens"]) for w in WORKLOADS.values())


@dataclass
class WeightsChoice:
    format: str
    reason: str  # one sentence for logs, stats and the demo
    timings: dict[str, FormatTiming] = field(default_factory=dict)
    not_eligible: dict[str, str] = field(default_factory=dict)  # format -> why auto left it out

    def to_dict(self) -> dict:
        return {"format": self.format, "reason": self.reason, "not_eligible": self.not_eligible,
                "timings": {f: {**asdict(t), "reference_s": round(t.reference_s, 3)} for f, t in self.timings.items()}}


def time_format(loaded, context: int = 128, repeats: int = 3) -> FormatTiming:
    """Time decode, verify and prefill forwards of a loaded model (medians of `repeats`). Whether it
    drafts is how its forward is written (exact by construction): on a CPU nothing else drafts. The
    exactness probe (~10 s for the 1.5B) runs only on the format that wins, when it serves."""
    from decoding.runners import runner_for, synthetic_tokens

    runner = runner_for(loaded, 1 << 30, role="timing", probe=False)
    ids = synthetic_tokens(runner.vocab_size, context + 256 + 1)
    runner.start([], "__weights__")
    runner.forward(ids[:context], logits_to_keep=1)

    def timed(n: int, keep: int | None = None) -> float:
        samples = []
        for _ in range(repeats + 1):  # the first call pays for allocations and kernel selection
            t0 = time.perf_counter()
            runner.forward(ids[context:context + n], logits_to_keep=keep)
            samples.append(time.perf_counter() - t0)
            runner.crop_to(context)
        return statistics.median(samples[1:])

    decode, verify = timed(1), timed(REFERENCE["verify_tokens"])
    prefill = timed(256, keep=1)
    runner.discard()
    return FormatTiming(round(decode * 1000, 2), round(verify * 1000, 2), round(256 / prefill, 1),
                        runner.exact_by_construction)


class TimingCache:
    """Weight formats' timings per model and device, each kept under its implementation (kernel, ISA,
    forward code) and the timing code: another kernel or code is timed again."""

    MODELS = 64  # models (and devices) kept: those timed last

    def __init__(self, path: Path | None = None):
        self.path = path or paths.draftwise_home() / CACHE_FILE

    @staticmethod
    def _name(fmt: str) -> str:
        return f"{implementation(fmt)} | timing {timing_code()}"

    def get(self, key: str) -> dict[str, FormatTiming]:
        entry = cache_files.read_record(self.path).get(key, {})
        timings = {}
        for name, t in (entry.items() if isinstance(entry, dict) else ()):
            fmt = name.split("-", 1)[0]
            if fmt in FORMATS and self._name(fmt) == name:
                try:
                    timings[fmt] = FormatTiming(**t)
                except TypeError:  # written by another version
                    pass
        return timings

    def put(self, key: str, fmt: str, timing: FormatTiming) -> None:
        """Kept under the record's lock, read and written inside it: another start's formats stay."""
        def change(data: dict) -> None:
            # forget models whose directory is gone (tests, moved checkouts)
            for k in [k for k in data if k.startswith("/") and not Path(k.split(" | ")[0]).exists()]:
                del data[k]
            entry = data.pop(key, None)
            entry = entry if isinstance(entry, dict) else {}
            entry[self._name(fmt)] = asdict(timing)
            data[key] = entry  # last: written last, evicted last

        cache_files.update_record(self.path, change, entries=self.MODELS)

    def one_at_a_time(self, key: str):
        """Held while this start times `key`'s formats: another start of the same model waits, then
        reads them."""
        return cache_files.one_at_a_time(self.path.parent, self.path.name, key, "weight format timings")


@functools.lru_cache(maxsize=1)
def timing_code(timed_by: Callable = time_format) -> str:
    from decoding.models.checkpoint import timing_stand_in

    return cache_files.code_hash(timed_by, timing_stand_in, extra=f"verify {REFERENCE['verify_tokens']}")


Loader = Callable[[str], object]  # format -> LoadedModel


def _runnable(candidates: list[str], device, not_eligible: dict[str, str], spec_text: str) -> list[str]:
    """The formats whose kernels run on this device for this model; the others go to not_eligible
    with why."""
    out = []
    for fmt in candidates:
        problem = kernel_problem(fmt, device, spec_text)
        if problem:
            # gguf is an optional extra (or a file a model may not have): its absence is not a fault
            log.log(logging.INFO if fmt == "gguf" else logging.WARNING, "weights %s skipped: %s", fmt, problem)
            not_eligible[fmt] = problem
        else:
            out.append(fmt)
    return out


# A checkpoint this large spends a step reading its weights: a float format (4 or 2 bytes a weight) cannot
# beat int8 or int4 (1 or ~0.6) on a CPU where our integer kernels run, so it is not timed there.
FLOATS_CANNOT_WIN_BYTES = 256 << 20


def _winnable(candidates: list[str], spec_text: str, not_eligible: dict[str, str]) -> list[str]:
    """The formats worth timing: float formats only where no integer format of ours runs here, or for a
    checkpoint small enough that a forward is not its weights' reading (the tests' tiny model)."""
    from decoding.kernels import integer_linear
    from decoding.models.checkpoint import checkpoint_bytes

    floats = [f for f in candidates if f in ("fp32", "bf16", "fp16")]
    integers = [f for f in candidates if f in ("int8", "int4")]
    if not floats or not integers or not integer_linear.load() or checkpoint_bytes(spec_text) < FLOATS_CANNOT_WIN_BYTES:
        return candidates
    for fmt in floats:
        not_eligible[fmt] = (f"not timed: a step reads {'four' if fmt == 'fp32' else 'two'} bytes a weight, where "
                             f"{' and '.join(integers)} on draftwise's kernels read one or less")
    return [f for f in candidates if f not in floats]


def _pick(timings: dict[str, FormatTiming], fastest: str, quality: dict[str, float]) -> str:
    """Among formats within SAME_SPEED of the fastest, the one with the best measured quality (first-line
    exact): two formats that close swap places between timings, and users should get the better text,
    not the one that won a coin toss."""
    limit = timings[fastest].reference_s * (1 + SAME_SPEED)
    close = [f for f, t in timings.items() if t.reference_s <= limit]
    return max(close, key=lambda f: (quality.get(f, float("-inf")), -timings[f].reference_s))


def _gated(gate: Callable[[str], tuple[list[str], str]], key: str, not_eligible: dict[str, str]):
    """The formats the quality gate lets a target use, and its verdict's source; the others go to
    not_eligible with why. A format's verdict holds where its quantization is the one measured."""
    candidates, why = gate(key)
    candidates = list(candidates)
    not_eligible.update({f: why for f in FORMATS if f not in candidates})
    for f in [f for f in candidates if not quantization_measured(f)]:
        not_eligible[f] = (f"{f} here is {implementation(f).split('-')[1]}'s quantization, which the quality "
                           "gate never measured")
        candidates.remove(f)
    return candidates, why


def _time_formats(formats: list[str], load: Loader, cache: TimingCache, key: str, timings: dict[str, FormatTiming],
                  not_eligible: dict[str, str], stand_in: Loader = lambda fmt: None):
    """Time each format, on its stand-in where it has one (checkpoint.timing_stand_in: the real shapes,
    zeros for weights), else on the real model; keep each timing as it comes. Returns the last real
    model loaded (None when none was)."""
    loaded = None
    for fmt in formats:
        loaded = timed = None
        gc.collect()
        try:
            timed = _stand_in_or_none(stand_in, fmt)
            loaded = load(fmt) if timed is None else None
            timings[fmt] = time_format(timed or loaded)
        except DraftwiseError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken kernel costs this format, not the load
            log.warning("weights %s skipped: timing failed: %s: %s", fmt, type(exc).__name__, exc)
            not_eligible[fmt] = f"failed when timed: {type(exc).__name__}"
            continue
        finally:
            timed = None  # a stand-in is gone before the next format's is built
        cache.put(key, fmt, timings[fmt])
        log.info("weights %s on %s: %s", fmt, key.rsplit(" | ", 1)[-1], timings[fmt])
    return loaded


def _stand_in_or_none(stand_in: Loader, fmt: str):
    """The format's stand-in, or None: none for it, or one that could not be built (then the real
    model is loaded and timed, and says what is wrong with it)."""
    try:
        return stand_in(fmt)
    except Exception as exc:  # noqa: BLE001 - the real load is the fallback
        log.info("weights %s timed on the real model: no stand-in (%s: %s)", fmt, type(exc).__name__, exc)
        return None


def choose_and_load(spec, device, role: str, load: Loader, cache: TimingCache | None = None,
                    gate: Callable[[str], tuple[list[str], str]] = quality_gate.eligible_formats,
                    stand_in: Loader = lambda fmt: None):
    """Load the model in the format `auto` picks. Returns (LoadedModel, WeightsChoice)."""
    if device.type == "cuda":
        return load("bf16"), WeightsChoice("bf16", "CUDA: bf16, the GPU's native format")
    if device.type != "cpu":
        return load("fp16"), WeightsChoice("fp16", f"{device.type}: fp16")
    key = model_key(spec)
    not_eligible: dict[str, str] = {}
    if role == "draft":
        candidates, why = list(FORMATS), "a draft model may use any format: the output stays the target's"
    else:
        candidates, why = _gated(gate, key, not_eligible)
    candidates = _winnable(_runnable(candidates, device, not_eligible, spec.value), spec.value, not_eligible)
    if not candidates:
        raise DraftwiseError(f"no weight format can run for {key} on {device}: {not_eligible}")
    cache = cache or TimingCache()
    where = device_key(device)
    timings = {f: t for f, t in cache.get(f"{key} | {where}").items() if f in candidates}
    loaded = None
    if set(candidates) - set(timings):
        with cache.one_at_a_time(f"{key} | {where}"):
            # what another start timed while this one waited is read, not timed again
            timings.update({f: t for f, t in cache.get(f"{key} | {where}").items() if f in candidates})
            missing = sorted(set(candidates) - set(timings), key=TIMING_ORDER.index)
            if missing:
                log.info("measuring weight format timings for %s | %s: %s", key, where, ", ".join(missing))
            loaded = _time_formats(missing, load, cache, f"{key} | {where}", timings, not_eligible, stand_in)
    if not timings:
        raise DraftwiseError(f"no weight format could be timed for {key}: {not_eligible}")
    loaded, best, fastest = _load_best(timings, loaded, load, quality_gate.first_line_exact(key) if role == "target" else {},
                                       not_eligible)
    others = ", ".join(f"{f} {t.reference_s:.2f} s" for f, t in sorted(timings.items(), key=lambda x: x[1].reference_s))
    how = ("fastest of the eligible formats" if best == fastest else
           f"closest to fp32's quality of the eligible formats within {SAME_SPEED:.0%} of the fastest")
    reason = f"{how} on this CPU for the requests users wait for ({others}); {why}"
    return loaded, WeightsChoice(best, reason, timings, not_eligible)


def _load_best(timings: dict[str, FormatTiming], loaded, load: Loader, quality: dict[str, float],
               not_eligible: dict[str, str]):
    """(the model, its format, the fastest format): the pick among the timed formats, loaded. A format
    timed on its stand-in is first loaded for real here: one whose load fails (memory, say) costs this
    start that format, with one log line, and the next pick is loaded; its timing stays kept, so a
    later start tries it again."""
    timings = dict(timings)
    while True:
        fastest = min(timings, key=lambda f: timings[f].reference_s)
        best = _pick(timings, fastest, quality)
        if loaded is not None and loaded.weights == best:
            return loaded, best, fastest
        loaded = None
        gc.collect()
        try:
            return load(best), best, fastest
        except DraftwiseError:
            raise
        except Exception as exc:  # noqa: BLE001 - the other formats may still load
            log.warning("weights %s skipped: loading failed: %s: %s", best, type(exc).__name__, exc)
            not_eligible[best] = f"failed to load: {type(exc).__name__}"
            del timings[best]
            if not timings:
                raise DraftwiseError(f"no weight format could be loaded: {not_eligible}") from exc


DTYPE_FORMATS = {"float32": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16",
                 "fp16": "fp16"}


def load_weights(spec_text: str, requested: str, device: str, dtype: str, trust_remote_code: bool, role: str,
                 context_tokens: int | None = None):
    """Load a model in the requested weight format, `auto` included. Returns (LoadedModel, WeightsChoice)."""
    from decoding.api import WEIGHT_FORMATS
    from decoding.errors import ModelSpecError
    from decoding.models.checkpoint import load_model, model_source, resolve_device, timing_stand_in
    from decoding.models.specs import parse_model_spec

    if requested not in WEIGHT_FORMATS:
        raise ModelSpecError(f"unknown weights '{requested}': use one of {', '.join(WEIGHT_FORMATS)}")
    spec = parse_model_spec(spec_text)
    if spec.kind == "preset" and requested != "gguf":
        model_source(spec)  # a preset not pulled yet says so now, not after a kernel is built to time formats

    def load(fmt: str):
        extra = {"context_tokens": context_tokens} if context_tokens else {}
        return load_model(spec_text, device, dtype, trust_remote_code, role, weights=fmt, **extra)

    if requested != "auto":
        return load(requested), WeightsChoice(requested, f"{requested}, as asked")
    if dtype != "auto":  # an explicit compute dtype is an explicit format
        fmt = DTYPE_FORMATS.get(dtype)
        if fmt is None:
            raise ModelSpecError(f"unknown dtype '{dtype}': use auto, float32, bfloat16 or float16")
        return load(fmt), WeightsChoice(fmt, f"{fmt}, from --dtype {dtype}")
    dev, _ = resolve_device(device, dtype)
    return choose_and_load(spec, dev, role, load, stand_in=lambda fmt: timing_stand_in(spec_text, fmt, dev, trust_remote_code))
