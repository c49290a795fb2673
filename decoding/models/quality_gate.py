"""Which weight formats keep completions as good as fp32: measured by the benchmark, kept here.

A format is eligible for `auto` on a model unless the benchmark shows it loses more than
MAX_DROP_POINTS of first-line exact match against fp32: the 95% interval of its paired difference from
fp32 on the same cases (`versus_fp32`, a bootstrap over cases) lies wholly below -MAX_DROP_POINTS. A
handful of cases proves nothing either way, so an entry without an interval falls back to the point
estimates. The figures come from `draftwise bench --weights ... --quality-cases N` (see
docs/weights.md, "The quality gate"); a model never measured gets the formats that passed on every measured model.
A format missing from a model's entry was not measured and is not eligible.
"""
from __future__ import annotations

from decoding.api import WEIGHT_FORMATS

MAX_DROP_POINTS = 2.0

# preset name -> the benchmark's quality figures (first-line exact match, percent of cases)
MEASURED: dict[str, dict] = {
    "qwen2.5-coder-0.5b": {
        "cases": 405,  # javascript 79, python 77, c 77, cpp 77, typescript 71, shellscript 24
        "first_line_exact": {"fp32": 17.8, "int8": 17.0, "int4": 14.6},
        "similarity": {"fp32": 0.594, "int8": 0.592, "int4": 0.583},
        # minus fp32, paired over the same cases. int8 (static forward): 2 cases only int8 got right, 5
        # only fp32. int4 (its own kernel): 2 and 15; it loses 3.2 points at the point estimate, but
        # the interval does not say it loses more than 2, which is what keeps a format out.
        "versus_fp32": {"int8": {"cases": 405, "difference_points": -0.7, "ci95": [-2.0, 0.5], "mcnemar_p": 0.45},
                        "int4": {"cases": 405, "difference_points": -3.2, "ci95": [-5.2, -1.2], "mcnemar_p": 0.002}},
        # three runs' records pooled (a case scored twice counts once): docs/bench/quality-0.5b-405.json
        "runs": ["draftwise bench --limit 1 --quality-cases 160 --max-tokens 24 --context-tokens 512 "
                 "--typing-cases 0 --cancel-tries 0 --weights fp32,int8 --modes none "
                 "--json docs/bench/quality-0.5b-fp32-int8-161.json (2026-12-03 07:25 UTC)",
                 "draftwise bench --max-tokens 24 --context-tokens 512 --typing-cases 0 --cancel-tries 0 "
                 "--weights int4 --modes none --quality-reference docs/bench/quality-0.5b-fp32-int8-161.json "
                 "--json docs/bench/quality-0.5b-int4-161.json (2026-12-03 19:03 UTC; the same cases)",
                 "draftwise bench --limit 1 --quality-cases 255 --seed 1 --max-tokens 24 --context-tokens 512 "
                 "--typing-cases 0 --cancel-tries 0 --weights fp32,int8,int4 --modes none "
                 "--json docs/bench/quality-0.5b-seed1-256.json (2026-12-04 02:23 UTC; 244 new cases)",
                 "draftwise bench --quality-merge docs/bench/quality-0.5b-fp32-int8-161.json,"
                 "docs/bench/quality-0.5b-int4-161.json,docs/bench/quality-0.5b-seed1-256.json "
                 "--json docs/bench/quality-0.5b-405.json"],
        # bf16 and gguf were not in these runs: not eligible until measured
    },
}


def verdicts(entry: dict) -> dict[str, bool]:
    """format -> passes the gate, for one model's entry: its 95% interval against fp32 where the entry
    has one, else first-line exact match in percent against fp32's."""
    scores, paired = entry["first_line_exact"], entry.get("versus_fp32", {})
    out = {}
    for fmt, score in scores.items():
        if fmt == "fp32":
            out[fmt] = True
        elif fmt in paired:
            out[fmt] = paired[fmt]["ci95"][1] >= -MAX_DROP_POINTS
        else:
            out[fmt] = scores["fp32"] - score <= MAX_DROP_POINTS
    return out


def first_line_exact(model_key: str | None, measured: dict[str, dict] | None = None) -> dict[str, float]:
    """format -> the benchmark's first-line exact match (percent) for this model; {} if never measured."""
    entry = (MEASURED if measured is None else measured).get(model_key or "")
    return dict(entry["first_line_exact"]) if entry else {}


def eligible_formats(model_key: str | None, measured: dict[str, dict] | None = None) -> tuple[list[str], str]:
    """The formats `auto` may choose for this model, and where that verdict comes from."""
    measured = MEASURED if measured is None else measured
    if model_key in measured:
        entry = measured[model_key]
        passed = [f for f, ok in verdicts(entry).items() if ok]
        return passed, f"quality gate: {entry['cases']} benchmark cases of {model_key}"
    if not measured:
        return ["fp32"], "quality gate: no model measured yet, so only fp32"
    per_model = [{f for f, ok in verdicts(e).items() if ok} for e in measured.values()]
    passed = sorted(set.intersection(*per_model), key=WEIGHT_FORMATS.index)
    return passed, f"quality gate: formats that passed on every measured model ({', '.join(measured)})"


# preset name -> whether the repository as context pays (`repoContext: "auto"`): paired first-line-exact
# differences, context on minus off, on cross-file cases (`draftwise bench --cross-file`) and on ordinary
# ones (`--corpus-context`). Filled from the runs in docs/repository-context.md.
REPO_CONTEXT: dict[str, dict] = {}


def repo_context_verdict(model_key: str | None, measured: dict[str, dict] | None = None) -> tuple[bool, str]:
    """Whether `repoContext: "auto"` turns the repository context on for this model, and why: it must gain
    on cross-file cases (the 95% interval above zero) and lose nothing significant on ordinary ones (the
    interval not wholly below zero). A model never measured gets it off."""
    entry = (REPO_CONTEXT if measured is None else measured).get(model_key or "")
    if entry is None:
        return False, f"not measured for {model_key}: off"
    cross, ordinary = entry["crossfile"], entry["ordinary"]
    gains, keeps = cross["ci95"][0] > 0, ordinary["ci95"][1] >= 0
    why = (f"cross-file cases {cross['difference_points']:+.1f} points [{cross['ci95'][0]:+.1f}, {cross['ci95'][1]:+.1f}], "
           f"ordinary cases {ordinary['difference_points']:+.1f} [{ordinary['ci95'][0]:+.1f}, {ordinary['ci95'][1]:+.1f}]")
    return gains and keeps, ("on: " if gains and keeps else "off: ") + why


# preset name -> whether the prompt's suffix pays with the lines after the cursor (`suffix: "auto"`): the
# paired first-line-exact difference on the gate's cases, the lines after the cursor (up to the suffix's
# budget) minus the rest of the cursor's line alone. The suffix follows the prefix, so a keystroke reads
# it again: it is shown only where it pays. From the runs in docs/weights.md ("The lines after the cursor").
SUFFIX_LINES: dict[str, dict] = {
    # int8, the gate's first 161 cases, both with healing: 2 cases only the lines got right, 21 only the line
    "qwen2.5-coder-0.5b": {
        "cases": 161, "difference_points": -11.8, "ci95": [-17.4, -6.2], "mcnemar_p": 0.000,
        "runs": ["draftwise bench --limit 1 --quality-cases 160 --max-tokens 24 --context-tokens 512 --typing-cases 0 "
                 "--cancel-tries 0 --weights int8 --modes none --quality-reference docs/bench/quality-0.5b-fp32-int8-161.json "
                 "--suffix lines --json docs/bench/quality-0.5b-int8-lines-161.json (2026-12-07 UTC)",
                 "draftwise bench --quality-merge docs/bench/quality-0.5b-int8-healed-161.json=healing,"
                 "docs/bench/quality-0.5b-int8-lines-161.json=lines --quality-versus int8/healing --max-tokens 24 "
                 "--context-tokens 512 --json docs/bench/quality-0.5b-lines-vs-healing.json"],
    },
    # int4, the gate's 404 cases (161, and 243 more of --seed 1's 255), both with healing: 21 cases only the lines got
    # right, 13 only the line; not significant, so auto keeps the line
    "qwen2.5-coder-1.5b": {
        "cases": 404, "difference_points": 2.0, "ci95": [-0.7, 4.7], "mcnemar_p": 0.230,
        "runs": ["docs/bench/quality-1.5b-int4-lines-161.json (--suffix lines), quality-1.5b-int4-lines-seed1-256.json "
                 "(whole_suffix set by hand before the flag existed: the same prompt) against quality-1.5b-int4-healed-161.json, quality-1.5b-int4-healed-seed1-256.json (2026-12-07 UTC)",
                 "draftwise bench --quality-merge docs/bench/quality-1.5b-int4-161.json=before,"
                 "docs/bench/quality-1.5b-int4-seed1-256.json=before,docs/bench/quality-1.5b-int4-healed-161.json=healing,"
                 "docs/bench/quality-1.5b-int4-healed-seed1-256.json=healing,docs/bench/quality-1.5b-int4-lines-161.json=lines,"
                 "docs/bench/quality-1.5b-int4-lines-seed1-256.json=lines --quality-versus int4/healing --max-tokens 24 "
                 "--context-tokens 512 --json docs/bench/quality-1.5b-lines-vs-healing.json"],
    },
}


def suffix_lines_verdict(model_key: str | None, measured: dict[str, dict] | None = None) -> tuple[bool, str]:
    """Whether `suffix: "auto"` shows this model the lines after the cursor, and why: the gate's cases must
    gain (the 95% interval above zero). A model never measured gets the rest of the cursor's line."""
    entry = (SUFFIX_LINES if measured is None else measured).get(model_key or "")
    if entry is None:
        return False, f"not measured for {model_key}: the rest of the cursor's line"
    gains = entry["ci95"][0] > 0
    why = (f"{entry['difference_points']:+.1f} points of first lines exact [{entry['ci95'][0]:+.1f}, "
           f"{entry['ci95'][1]:+.1f}] on {entry['cases']} gate cases")
    return gains, ("the lines after the cursor: " if gains else "the rest of the cursor's line: ") + why


def suffix_choice(suffix: str, target: str, measured: dict[str, dict] | None = None) -> tuple[bool, str]:
    """Whether the prompt shows the lines after the cursor (EngineConfig.suffix: one of SUFFIXES), and why."""
    from decoding.api import SUFFIXES
    from decoding.errors import DraftwiseError
    from decoding.models.specs import model_key, parse_model_spec

    if suffix not in SUFFIXES:
        raise DraftwiseError(f"suffix must be one of {', '.join(SUFFIXES)}, got {suffix!r}")
    if suffix == "lines":
        return True, "the lines after the cursor, as asked"
    if suffix == "line":
        return False, "the rest of the cursor's line, as asked"
    return suffix_lines_verdict(model_key(parse_model_spec(target)), measured)
