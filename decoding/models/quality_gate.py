"""Which weight formats keep completions as good as fp32: measured by the benchmark, kept here.

A format is eligible for `auto` on a model when its first-line exact match against the ground truth
removed from the benchmark's cases is within MAX_DROP_POINTS of fp32's on the same cases. The
figures come from `draftwise bench --weights ... --quality-cases N` (see README, "Weights"); a
model that was never measured gets the formats that passed on every measured model.
"""
from __future__ import annotations

from decoding.api import WEIGHT_FORMATS

MAX_DROP_POINTS = 2.0

# preset name -> the benchmark's quality figures (first-line exact match, percent of cases)
MEASURED: dict[str, dict] = {'qwen2.5-coder-0.5b': {'cases': 41,
                        # gguf: the llamacpp-plain anchor of the first run, the same GGUF file on the same cases
                        'first_line_exact': {'fp32': 17.1, 'int8': 14.6, 'bf16': 17.1, 'gguf': 17.1},
                        'similarity': {'llamacpp-q4': 0.62, 'fp32': 0.629, 'int8': 0.595, 'bf16': 0.608},
                        'llamacpp_q4_first_line_exact': 17.1,
                        'runs': ['draftwise bench --limit 1 --quality-cases 40 --max-tokens 48 '
                                 '--typing-cases 0 --cancel-tries 0 --weights fp32,int8 --modes '
                                 'none,llamacpp-plain --json quality-0.5b-fp32-int8.json (2026-12-01 04:43 UTC)',
                                 'draftwise bench --limit 1 --quality-cases 40 --max-tokens 48 '
                                 '--typing-cases 0 --cancel-tries 0 --weights bf16 --modes none --json '
                                 'quality-0.5b-bf16.json (2026-12-01 04:49 UTC)']}}


def verdicts(first_line_exact: dict[str, float]) -> dict[str, bool]:
    """format -> passes the gate, from first-line exact match in percent (fp32 must be present)."""
    reference = first_line_exact["fp32"]
    return {fmt: reference - score <= MAX_DROP_POINTS for fmt, score in first_line_exact.items()}


def eligible_formats(model_key: str | None, measured: dict[str, dict] | None = None) -> tuple[list[str], str]:
    """The formats `auto` may choose for this model, and where that verdict comes from."""
    measured = MEASURED if measured is None else measured
    if model_key in measured:
        entry = measured[model_key]
        passed = [f for f, ok in verdicts(entry["first_line_exact"]).items() if ok]
        return passed, f"quality gate: {entry['cases']} benchmark cases of {model_key}"
    if not measured:
        return ["fp32"], "quality gate: no model measured yet, so only fp32"
    per_model = [{f for f, ok in verdicts(e["first_line_exact"]).items() if ok} for e in measured.values()]
    passed = sorted(set.intersection(*per_model), key=WEIGHT_FORMATS.index)
    return passed, f"quality gate: formats that passed on every measured model ({', '.join(measured)})"
