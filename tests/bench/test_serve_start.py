"""`draftwise bench --serve-start`: a real `draftwise serve` process (the tiny model), timed from its
spawn to its first inline suggestion."""
from __future__ import annotations

from bench.serve_memory import serve_start


def test_a_start_is_timed_to_its_first_suggestion(tiny_model_dir):
    row = serve_start(str(tiny_model_dir), "fp32", timeout_s=120)
    assert isinstance(row, dict), row  # else: why it could not be measured
    assert 0 < row["ready_s"] <= row["first_suggestion_s"] < 120


def test_a_server_that_cannot_start_is_reported_not_raised(tmp_path):
    assert serve_start(str(tmp_path / "no-such-model"), "fp32", timeout_s=60).startswith("not measured: ")
