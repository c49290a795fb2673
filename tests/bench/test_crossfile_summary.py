"""The cross-file benchmark's rows and its paired verdict (with and without the repository context),
on records made by hand: the runs themselves need packages and a model (`draftwise bench --cross-file`)."""
from __future__ import annotations

from bench.crossfile import run_plan, summarize_crossfile
from bench.metrics import RunRecord


def test_rows_with_and_without_the_lookup_drafter():
    assert [row for row, *_ in run_plan("int4", ("off", "on"))] == [
        "none@int4", "lookup@int4", "none@int4+context", "lookup@int4+context", "lookup@int4+context-index"]
    # --modes none: quality alone, the plain rows both ways
    assert run_plan("int4", ("off", "on"), lookup=False) == [("none@int4", "none", False, False),
                                                             ("none@int4+context", "none", True, False)]
    assert [row for row, *_ in run_plan("int8", ("on",), lookup=False)] == ["none@int8+context"]


def record(mode: str, case: str, right: bool) -> RunRecord:
    return RunRecord(mode, case, "python", text="x", generated_tokens=4, target_forwards=4,
                     first_line_exact=right, similarity=1.0 if right else 0.5)


def test_the_context_gain_is_paired_per_case_with_an_interval():
    # 20 cases: the context right in 6 more, wrong in 1 the plain prompt got right
    plain = {f"c{i}": record("none@int4", f"c{i}", i < 3) for i in range(20)}
    context = {f"c{i}": record("none@int4+context", f"c{i}", i in (0, 1) or 10 <= i < 16) for i in range(20)}
    summary = summarize_crossfile({"none@int4": plain, "none@int4+context": context})
    assert summary["none@int4"]["first_line_exact"] == 0.15 and summary["none@int4+context"]["first_line_exact"] == 0.4
    paired = summary["paired"]
    assert paired["repo_right_plain_wrong"] == 6 and paired["plain_right_repo_wrong"] == 1
    diff = paired["difference"]
    assert diff["cases"] == 20 and diff["difference_points"] == 25.0
    low, high = diff["ci95"]
    assert 0 <= low < 25.0 < high  # six against one on 20 cases: not yet clear of no gain (p 0.125)
    assert diff["only_this_right"] == 6 and diff["only_reference_right"] == 1 and diff["mcnemar_p"] == 0.125
    from bench.report import crossfile_markdown

    table = crossfile_markdown({"cases": [], "summary": summary})
    assert "made 6 first lines right and 1 wrong (first line exact +25.0 points, 95% interval" in table
