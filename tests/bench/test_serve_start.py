"""`draftwise bench --serve-start` and `--serve-rss`: a real `draftwise serve` process (the tiny model),
timed from its spawn to its first inline suggestion, and its resident memory with and without a draft
model (the tiny model drafts for itself: these tests assert the mechanics, not a size)."""
from __future__ import annotations

from bench.serve_memory import serve_rss_mib, serve_start


def test_a_start_is_timed_to_its_first_suggestion(tiny_model_dir):
    row = serve_start(str(tiny_model_dir), "fp32", timeout_s=120)
    assert isinstance(row, dict), row  # else: why it could not be measured
    assert 0 < row["ready_s"] <= row["first_suggestion_s"] < 120


def test_a_server_that_cannot_start_is_reported_not_raised(tmp_path):
    assert serve_start(str(tmp_path / "no-such-model"), "fp32", timeout_s=60).startswith("not measured: ")


def test_memory_is_measured_per_format_and_with_the_draft_model_loaded(tiny_model_dir, tmp_path):
    rss = serve_rss_mib(str(tiny_model_dir), ["fp32", "int8"], draft=str(tiny_model_dir), timeout_s=120)
    assert list(rss) == ["fp32", "int8", "int8+draft"], rss  # fp32 is the reference, never served with a draft
    assert all(isinstance(v, float) and v > 50 for v in rss.values()), rss  # a Python with torch: >50 MiB
    missing = serve_rss_mib(str(tiny_model_dir), ["int8"], draft=str(tmp_path / "no-such-draft"), timeout_s=60)
    assert isinstance(missing["int8"], float) and missing["int8+draft"].startswith("not measured: "), missing


def test_the_first_suggestion_in_a_just_opened_file_is_timed_per_pause(tiny_model_dir):
    """`--cold-start`: each pause's files are new to the server; after a pause the cursor hint's
    read-ahead has the prompt, asked at once the request reads it (the tiny model: mechanics, not speed)."""
    from bench import report
    from bench.cold_start import PAUSES_S, cold_cases, cold_start

    cases = cold_cases(1)
    assert len(cases) == len(PAUSES_S) and len({c.source for c in cases}) == len(cases)
    row = cold_start(str(tiny_model_dir), "int8", cases, timeout_s=120)
    assert [r["pause_s"] for r in row["runs"]] == list(PAUSES_S) and not any(r["error"] for r in row["runs"])
    at_once, after_3s = row["runs"][0], row["runs"][-1]
    assert at_once["prompt_tokens"] > 500 and after_3s["prompt_tokens"] > 500
    # read ahead while the editor paused: the request joined the suggestion started there, or found its prompt read
    assert after_3s["answered_by"] == "idle work" or after_3s["reused_prompt_tokens"] >= after_3s["prompt_tokens"] - 1
    assert row["pauses"]["3s"]["read_ahead_median"] >= after_3s["prompt_tokens"] - 1
    assert row["pauses"]["3s"]["p50_ms"] > 0 and "| 3s | 1 |" in "\n".join(report.cold_start_markdown(row))
    assert 0 < row["pauses"]["0s"]["prompt_reading_share"] <= 1  # the prompt read since the open, of the wait
    assert all(0 <= v["prompt_reading_share"] <= 1 for v in row["pauses"].values())
    unhinted = cold_start(str(tiny_model_dir), "int8", cases[:1], hint=False, timeout_s=120, pauses=(1.0,))
    assert unhinted["cursor_hint"] is False and unhinted["runs"][0]["error"] is None
    assert unhinted["runs"][0]["answered_by"] == "request"  # no cursor: nothing started there


def test_prompt_readings_share_counts_the_pause_where_idle_work_answered():
    """A request that joined idle work waited for the rest of a job started at the open, the pause
    earlier: reading's share is of the pause and the wait; a request that read its prompt itself, of its wait."""
    from bench.cold_start import ColdRun, summary

    runs = [ColdRun("a", 1.0, wait_ms=1000.0, prompt_tokens=1000, prefill_ms=1500.0, answered_by="idle work"),
            ColdRun("b", 1.0, wait_ms=1000.0, prompt_tokens=1000, prefill_ms=1500.0, answered_by="idle work"),
            ColdRun("c", 0.0, wait_ms=2000.0, prompt_tokens=1000, prefill_ms=1500.0, answered_by="request"),
            ColdRun("d", 0.0, wait_ms=0.0, error="gone")]
    row = summary(runs, pauses=(0.0, 1.0))
    assert row["1s"]["prompt_reading_share"] == 0.75 and row["1s"]["answered_by_idle_work"] == 2  # 1500 of 2000
    assert row["0s"]["prompt_reading_share"] == 0.75 and row["0s"]["runs"] == 1  # 1500 of its own 2000
    assert row["1s"]["read_ahead_median"] == 1000 and row["0s"]["read_ahead_median"] == 0
