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
