"""How long a forward of n new tokens takes on this device, measured: the cost model prices drafts
with these tables (decoding/cost_model.py), and a draft model is kept only where its measured steps
can pay (decoding/setup/draft_choice.py)."""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class ForwardTimes:
    """Seconds per target forward by number of new tokens, measured on this device.

    longer: the same forwards timed on a longer cache (lengths: the two caches' lengths). Attention
    reads every cached key, so a forward costs more on a 1,000-token prompt than on a 128-token one
    (the 0.5B, int4, measured on the since removed compiled forward: a decode step 40 -> 45 ms from
    128 to 1,024 tokens, a 4-row forward 62 -> 68 ms, and 76 ms at 1,400): drafts priced on the short
    cache alone looked cheaper than they were on real prompts. Times for a cache of another length are
    interpolated (and extrapolated) linearly in it."""

    by_tokens: dict[int, float]
    longer: dict[int, float] | None = None
    lengths: tuple[int, int] = (128, 128)

    def observe(self, n: int, seconds: float, weight: float = 0.1, length: int | None = None) -> None:
        """Keep the table current. The machine's speed drifts (load, a neighbour on the host) and moves
        every width alike, so half of what a forward says moves the whole table; the other half moves
        its own width (what it costs next to the others). Moving one width alone let plain decoding's
        steps follow the drift while verify forwards, once drafting stopped, never ran to catch up."""
        if n > max(self.by_tokens):  # a prompt read: not a width drafts are priced at
            return
        predicted = self(n, length)
        tables = [self.by_tokens] + ([self.longer] if self.longer is not None else [])
        level = 1.0 + 0.5 * weight * (seconds / predicted - 1.0)
        for table in tables:
            for key in table:
                table[key] *= level
        own = 1.0 + 0.5 * weight * (seconds / self(n, length) - 1.0)
        for table in tables:
            table[n] = self._lookup(table, n) * own

    def __call__(self, n: int, length: int | None = None) -> float:
        short = self._lookup(self.by_tokens, n)
        if self.longer is None or length is None:
            return short
        (a, b), long = self.lengths, self._lookup(self.longer, n)
        return max(short, short + (long - short) * (length - a) / (b - a)) if length > a else short

    @staticmethod
    def _lookup(table: dict[int, float], n: int) -> float:
        if n in table:
            return table[n]
        pts = sorted(table.items())
        lo = max((p for p in pts if p[0] <= n), default=pts[0])
        hi = min((p for p in pts if p[0] >= n), default=pts[-1])
        if lo[0] == hi[0]:  # outside the measured range: extend the last slope
            (n1, t1), (n2, t2) = pts[-2:] if n > pts[-1][0] else pts[:2]
            return max(t1, t1 + (t2 - t1) / (n2 - n1) * (n - n1))
        return lo[1] + (hi[1] - lo[1]) * (n - lo[0]) / (hi[0] - lo[0])


TIMES_FILE = "forward-times.json"


def kept_forward_times(runner, repeats: int = 3, long_context: int | None = None, **kwargs) -> ForwardTimes:
    """measure_forward_times, kept in $DRAFTWISE_HOME per model, kernel and forward code, device,
    thread count and the timing code itself: a later start reads them (a start took 2.4 s timing
    forwards), and of two starting together one times while the other waits for its table. The table
    follows the machine's drift from the first request on (ForwardTimes.observe). Quick one-repeat
    timings (tests, `measure_cost` off) are neither read nor kept."""
    import json

    import torch

    from decoding.home import cache_files, paths
    from decoding.models.checkpoint import device_key
    from decoding.models.specs import model_key
    from decoding.models.weights import implementation

    loaded = getattr(runner, "loaded", None)
    if repeats < 3 or loaded is None or loaded.spec is None:
        return measure_forward_times(runner, repeats=repeats, long_context=long_context, **kwargs)
    timing_code = cache_files.code_hash(*TIMING_CODE)
    key = " | ".join([model_key(loaded.spec), implementation(loaded.weights), device_key(loaded.device),
                      f"{torch.get_num_threads()} threads", f"long {long_context}", json.dumps(kwargs, sort_keys=True),
                      f"timing {timing_code}"])

    def measure() -> dict:
        times = measure_forward_times(runner, repeats=repeats, long_context=long_context, **kwargs)
        return {"by_tokens": times.by_tokens, "longer": times.longer, "lengths": list(times.lengths)}

    entry, _ = cache_files.kept_or_measured(paths.draftwise_home() / TIMES_FILE, key, measure, "forward times",
                                            valid=lambda kept: bool(_from_entry(kept)))
    return _from_entry(entry)


def _from_entry(t: dict) -> ForwardTimes:
    """A kept table (JSON's keys are strings); KeyError, TypeError or ValueError for one written by
    another version."""
    return ForwardTimes({int(n): float(s) for n, s in t["by_tokens"].items()},
                        {int(n): float(s) for n, s in t["longer"].items()} if t["longer"] else None,
                        tuple(t["lengths"]))


def measure_forward_times(runner, sizes=(1, 2, 4, 8, 12, 16), context: int = 128, repeats: int = 3,
                          long_context: int | None = None) -> ForwardTimes:
    """Time forwards of each size on top of a `context`-token cache (medians of `repeats`), and on a
    `long_context`-token one where given."""
    if long_context and long_context > context and hasattr(runner, "assume_cached"):
        short, long_ = _timed_alternating(runner, sizes, (context, long_context), repeats)
        return ForwardTimes(_smoothed(short), _smoothed(long_), (context, long_context))
    short = _smoothed(_timed(runner, sizes, context, repeats))
    if not long_context or long_context <= context:
        return ForwardTimes(short)
    long_ = _smoothed(_timed(runner, sizes, long_context, repeats))
    return ForwardTimes(short, long_, (context, long_context))


def _timed_alternating(runner, sizes, contexts: tuple[int, int], repeats: int) -> tuple[dict, dict]:
    """Both caches' times, one forward of each size on each in turn: a machine whose speed drifts
    (another process, a neighbour on the host) moves both tables alike, not one against the other."""
    from decoding.runners import synthetic_tokens

    base = synthetic_tokens(runner.vocab_size, max(contexts) + max(sizes) + 1)
    runner.start([], "__cost_model__")
    samples: list[dict[int, list[float]]] = [{n: [] for n in sizes} for _ in contexts]
    try:
        for rep in range(repeats + 1):  # the first round warms up (allocations, kernel selection)
            for n in sizes:
                for table, context in zip(samples, contexts):
                    runner.assume_cached(base[:context])  # timing needs a cache this long, not its values
                    t0 = time.perf_counter()
                    runner.forward(base[context:context + n])
                    if rep:
                        table[n].append(time.perf_counter() - t0)
    finally:
        runner.discard()
    short, long_ = ({n: statistics.median(v) for n, v in table.items()} for table in samples)
    return short, long_


def _timed(runner, sizes, context: int, repeats: int) -> dict[int, float]:
    from decoding.runners import synthetic_tokens

    base = synthetic_tokens(runner.vocab_size, context + 1)
    runner.start(base, "__cost_model__")
    runner.sync(base)
    for n in (1, max(sizes)):  # warm-up: first calls pay for allocations and kernel selection
        runner.forward(base[1:n + 1])
        runner.crop_to(context)
    times = {}
    for n in sizes:
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            runner.forward(base[1:n + 1])
            samples.append(time.perf_counter() - t0)
            runner.crop_to(context)
        times[n] = statistics.median(samples)
    runner.discard()  # don't keep the synthetic cache
    return times


def _smoothed(times: dict[int, float]) -> dict[int, float]:
    # Smooth measurement noise with a least-squares line t = a + b*n (b >= 0: more tokens never cost less).
    ns, ts = list(times), list(times.values())
    mean_n, mean_t = statistics.fmean(ns), statistics.fmean(ts)
    var = sum((n - mean_n) ** 2 for n in ns)
    b = max(0.0, sum((n - mean_n) * (t - mean_t) for n, t in zip(ns, ts)) / var) if var else 0.0
    a = max(mean_t - b * mean_n, 1e-6)
    return {n: a + b * n for n in ns}


TIMING_CODE = (measure_forward_times, _timed_alternating, _timed, _smoothed)  # kept tables name its hash
