"""`draftwise replay` end to end: a small file typed through real `draftwise serve` processes (the
tiny model), idle work off and on side by side, and the JSON it writes."""
from __future__ import annotations

import json

from lsp_server.cli import main

RUN_KEYS = ("pause_to_suggestion_ms_p50", "pause_to_suggestion_ms_p95", "shown_within_1s_share",
            "accepted_share", "chars_saved_share", "compute_s_per_char")


def small_file(tmp_path):
    body = "\n".join(f"def step_{i}(value):\n    result = value * {i} + {i}\n    return result\n" for i in range(30))
    path = tmp_path / "steps.py"
    path.write_text(body + "\n\nprint(step_3(2))\n")
    return path


def test_replay_types_a_file_through_the_server_and_reports_each_run(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "replay.json"
    code = main(["replay", str(small_file(tmp_path)), "--target", str(tiny_model_dir), "--weights", "fp32",
                 "--max-tokens", "4", "--chars", "30", "--speed", "1.5", "--idle", "both", "--llamacpp", "off",
                 "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert set(data["runs"]) == {"on", "off"}
    assert data["files"] == [{"path": "steps.py", "language": "python", "line": data["files"][0]["line"],
                              "chars": data["files"][0]["chars"]}]
    assert data["machine"]["cores"] >= 1 and data["versions"]["pygls"]
    for name, run in data["runs"].items():
        assert all(key in run for key in RUN_KEYS)
        assert run["settings"]["idleWork"] == (name == "on")
        assert run["pauses"] >= 1 and run["requests"] >= 1
        assert run["chars"] == data["files"][0]["chars"] >= 30
        assert run["typed_chars"] + run["accepted_chars"] == run["chars"]
        assert run["accepted"] <= run["shown"] <= run["requests"]
        for key in ("shown_within_1s_share", "chars_saved_share", "accepted_share"):
            assert run[key] is None or 0 <= run[key] <= 1
        assert run["compute_s_per_char"] > 0  # the server did read prompts and decode
        assert run["server_suggestions"]["shown"] >= run["shown"]  # the server sent at least what was shown
        p50, p95 = run["pause_to_suggestion_ms_p50"], run["pause_to_suggestion_ms_p95"]
        assert (p50 is None) == (p95 is None) and (p50 is None or 0 <= p50 <= p95)
    assert "draftwise replay" in capsys.readouterr().out  # the table, on the tool's stdout


def test_replay_in_a_workspace_runs_with_the_repository_context_off_and_on(tiny_model_dir, tmp_path, capsys):
    """--workspace: the files are typed at their own place in a real folder the server indexes;
    --repo-context both: one run without the context and one with it, each saying what its prompts read."""
    workspace = tmp_path / "pkg"
    workspace.mkdir()
    (workspace / "models.py").write_text(
        "class Account:\n    \"\"\"A customer's account.\"\"\"\n\n    def __init__(self, owner, balance):\n"
        "        self.owner = owner\n        self.balance = balance\n\n    def deposit(self, amount):\n"
        "        self.balance += amount\n        return self.balance\n")
    steps = small_file(workspace)
    steps.write_text("from models import Account\n\n" + steps.read_text())
    out = tmp_path / "replay.json"
    code = main(["replay", str(steps), "--workspace", str(workspace), "--target", str(tiny_model_dir),
                 "--weights", "fp32", "--max-tokens", "4", "--chars", "30", "--speed", "1.5", "--idle", "off",
                 "--repo-context", "both", "--llamacpp", "off", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert set(data["runs"]) == {"off", "off+context"}
    assert data["settings"]["repo_context"] == "both"
    for name, run in data["runs"].items():
        with_context = name.endswith("+context")
        assert run["settings"]["repoContext"] is with_context
        assert run["requests"] >= 1 and run["prompt_tokens_read_per_request_p50"] >= 0
        assert run["prompt_tokens_read_per_char"] > 0  # the first request read its whole prompt
        context = run["server_repo_context"]
        if with_context:  # the workspace was indexed and the requests chose their context from it
            assert context["index"]["files"] == 2 and context["selections"]["made"] >= 1
    comparison = data["comparisons"]["off+context vs off"]  # None only if a run showed nothing
    assert comparison is None or comparison["interval_95"][0] <= comparison["ratio"] <= comparison["interval_95"][1]
    table = capsys.readouterr().out
    assert "off+context" in table and "prompt read" in table


def _run(latencies_ms):
    return {"files": [{"pause_latencies_ms": [None, *latencies_ms]}]}


def test_p50_ratio_has_an_interval_that_narrows_with_more_pauses():
    from bench.replay.runs import p50_ratio

    slow, fast = [110.0, 90.0, 130.0, 100.0, 120.0], [50.0, 45.0, 55.0, 60.0, 40.0]
    few = p50_ratio(_run(slow), _run(fast))
    assert few["ratio"] == 2.2 and few["pauses"] == 5  # 110 / 50; the None (nothing shown) left out
    many = p50_ratio(_run(slow * 20), _run(fast * 20))
    assert many["ratio"] == 2.2
    width = lambda c: c["interval_95"][1] - c["interval_95"][0]  # noqa: E731
    assert many["interval_95"][0] <= 2.2 <= many["interval_95"][1] and width(many) < width(few)
    assert p50_ratio(_run([]), _run(fast)) is None
    # more suggestions already on screen (0 ms) move the p50 while the computed ones stay as fast
    mixed = p50_ratio(_run([0.0] * 4 + slow), _run(slow))
    assert mixed["already_shown"] == 4 and mixed["reference_already_shown"] == 0
    assert mixed["computed_p50_ms"] == mixed["reference_computed_p50_ms"] == 110.0 and mixed["ratio"] < 1


def test_replay_refuses_the_repository_context_without_a_workspace(tiny_model_dir, tmp_path, capsys):
    code = main(["replay", str(small_file(tmp_path)), "--target", str(tiny_model_dir), "--repo-context", "on",
                 "--llamacpp", "off"])
    assert code != 0
    assert "--workspace" in capsys.readouterr().err
