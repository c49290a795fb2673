"""How wide a verify forward may be and stay lossless, measured on the runner that will serve.

Drafting is lossless only if every row of a k-token forward is bit-identical to the one-token step
at that position: a near-tie between two tokens flips on the smallest difference. Whether it is
depends on kernels, not on the model's maths (a float GEMM picks other code paths for other row
counts; llama.cpp switches kernels with the batch size), so it is measured: at a few cache
positions (short, mid, near the runner's limit), forwards of every width the engine uses are
compared with as many one-token steps. `exact_width` is the widest width up to which all of them
matched; drafts are capped one token below it (1: no drafting). Results are kept in
$DRAFTWISE_HOME, keyed by model, format, forward path and device, so later starts measure nothing.
"""
from __future__ import annotations

import json
import logging

import torch

from decoding.models import paths
from decoding.runners.base import synthetic_tokens

log = logging.getLogger(__name__)

MAX_WIDTH = 17  # a 16-token draft plus the target's own token (CostModel.max_draft + 1)
CACHE_FILE = "exactness.json"
VERSION = 2  # bump when the probe changes what it measures (a forward's code is in the key already)


def positions(limit: int, widest: int = MAX_WIDTH) -> list[int]:
    """Where to probe: a short cache, a mid one, and one near the runner's limit (the widest forward
    probed there still fits)."""
    near = limit - widest - 2
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
    where = positions(limit, max(widths))
    ids = code_tokens(runner, max(where) + max(widths) + 1)
    per_width: dict[int, float] = {w: 0.0 for w in widths}
    runner.start([], "__exactness__")
    try:
        for pos in where:
            if hasattr(runner, "assume_cached"):  # the rows compared read the same cache, whatever it holds
                runner.assume_cached(ids[:pos])
            else:
                runner.sync(ids[:pos + 1])  # the cache holds ids[:pos]
            steps = torch.cat([runner.forward([t]) for t in ids[pos:pos + max(widths)]])
            runner.crop_to(pos)
            for w in widths:
                rows = runner.forward(ids[pos:pos + w])
                runner.crop_to(pos)
                if not torch.equal(rows, steps[:w]):  # NaN never counts as equal
                    diff = float((rows - steps[:w]).abs().nan_to_num(nan=float("inf")).max())
                    per_width[w] = max(per_width[w], diff if diff > 0 else float("inf"))
    finally:
        runner.discard()
    exact = 1
    for w in widths:
        if per_width[w] != 0.0:
            break
        exact = w
    beyond = max((d for w, d in per_width.items() if w > exact), default=0.0)
    return {"exact_width": exact, "max_difference": beyond, "per_width": per_width, "positions": where}


def _key(runner) -> str | None:
    from decoding.models.loading import device_key
    from decoding.models.specs import model_key
    from decoding.models.weights import implementation

    loaded = runner.loaded
    if loaded.spec is None:
        return None
    return (f"v{VERSION} | {model_key(loaded.spec)} | {implementation(loaded.weights)} | "
            f"{getattr(runner, 'path', 'eager')} | "
            f"{device_key(loaded.device)}")


def measure(runner) -> dict:
    """Set runner.exact_width (and verify_difference) from the kept result or a new probe."""
    key = _key(runner)
    file = paths.draftwise_home() / CACHE_FILE
    try:
        kept = json.loads(file.read_text())
    except (OSError, ValueError):
        kept = {}
    result = kept.get(key) if key else None
    if result is None:
        result = probe(runner)
        if key:
            kept[key] = result
            try:
                paths.atomic_write(file, json.dumps(kept, indent=1))
            except OSError as exc:  # a read-only home costs the next start a probe
                log.warning("could not keep the exactness probe in %s: %s", file, exc)
        log.info("exactness probe (%s): exact up to %d rows at positions %s; beyond: %.3g",
                 key, result["exact_width"], result["positions"], result["max_difference"])
    runner.exact_width = int(result["exact_width"])
    runner.verify_difference = float(result["max_difference"])
    if runner.exact_width > 1 and runner.device.type == "cpu" and not runner.exact_by_construction:
        runner.not_exact_why = (f"the probe found rows exact up to {runner.exact_width}, but this forward is not "
                                "exact by construction on a CPU: other prompts can differ")
        runner.exact_width = 1
    runner.exactness = result
    # The first forward reads the prompt's tail and a draft: together no wider than the exact width.
    runner.prompt_tail = max(1, min(runner.prompt_tail, runner.exact_width - (MAX_WIDTH - 1)))
    return result
