"""Metric math, goal checks, and the report/JSON/plot outputs, on hand-made run records."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from bench.corpus import Case
from bench.harness import Bench, BenchSettings, build_report_data
from bench.hf_baselines import GenerateTiming
from bench.metrics import (
    MIN_DECODE_TOKENS, RunRecord, case_speedups, check_goals, completion_quality, draft_model_verdict, family_plain,
    identical_rate, percentile, split_key, summarize, summarize_mode,
)
from bench.report import REQUIRED_MODE_KEYS, markdown, plot, write_json


def rec(mode, case, tok_s=None, *, text="x", lang="python", decode_tokens=20, total_ms=1000.0, forwards=None,
        drafted=None, accepted=None, drafted_by=None, error=None):
    decode_ms = decode_tokens / tok_s * 1000 if tok_s else 0.0
    return RunRecord(mode=mode, case_id=case, language=lang, text=text, generated_tokens=decode_tokens + 1,
                     decode_tokens=decode_tokens, decode_ms=decode_ms, total_ms=total_ms,
                     target_forwards=decode_tokens if forwards is None else forwards,
                     drafted_tokens=drafted, accepted_tokens=accepted, drafted_by=drafted_by or {}, error=error)


def by_case(*records):
    return {r.case_id: r for r in records}


@pytest.mark.parametrize("q", [0, 5, 37.5, 50, 95, 100])
def test_percentile_matches_numpy(q):
    xs = [random.Random(i).uniform(0, 100) for i in range(11)]
    assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_edge_cases():
    assert percentile([], 50) is None
    assert percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_decode_rate_needs_enough_tokens():
    assert rec("none", "a", 10.0).decode_tok_s == pytest.approx(10.0)
    short = rec("none", "a", 10.0, decode_tokens=MIN_DECODE_TOKENS - 1)
    assert short.decode_tok_s is None
    assert rec("none", "a", 10.0, error="boom").decode_tok_s is None


def test_case_speedups_and_identical_rate():
    ref = by_case(rec("hf-plain", "a", 10.0, text="p"), rec("hf-plain", "b", 20.0, text="q"),
                  rec("hf-plain", "c", 5.0, text="r"))
    mode = by_case(rec("auto", "a", 30.0, text="p"), rec("auto", "b", 10.0, text="q"),
                   rec("auto", "c", 5.0, text="different"), rec("auto", "d", 50.0, text="s"))
    assert case_speedups(mode, ref) == {"a": pytest.approx(3.0), "b": pytest.approx(0.5), "c": pytest.approx(1.0)}
    assert identical_rate(mode, ref) == pytest.approx(2 / 3)


def _runs():
    cases = ["a", "b", "c", "d"]
    langs = {"a": "python", "b": "python", "c": "c", "d": "javascript"}
    plain = {"a": 6.0, "b": 6.5, "c": 6.2, "d": 6.4}
    runs = {"hf-plain": by_case(*(rec("hf-plain", c, plain[c], lang=langs[c], total_ms=10_000 + i * 1000)
                                  for i, c in enumerate(cases)))}
    runs["none"] = by_case(*(rec("none", c, plain[c] * 1.1, lang=langs[c]) for c in cases))
    runs["lookup"] = by_case(*(rec("lookup", c, plain[c] * s, lang=langs[c], forwards=10, drafted=40, accepted=30,
                                   drafted_by={"lookup": 40})
                               for c, s in zip(cases, (4.0, 3.0, 0.5, 3.5))))
    runs["auto"] = by_case(*(rec("auto", c, plain[c] * s, lang=langs[c], forwards=8, drafted=20, accepted=18,
                                 drafted_by={"lookup": 20})
                             for c, s in zip(cases, (4.2, 3.1, 1.1, 3.6))))
    runs["model"] = by_case(*(rec("model", c, plain[c] * 0.8, lang=langs[c], drafted=10, accepted=5,
                                  drafted_by={"model": 10}) for c in cases))
    return runs


def test_summary_numbers():
    runs = _runs()
    s = summarize_mode("auto", runs)
    assert s["speedup_vs_plain"] == pytest.approx(np.median([4.2, 3.1, 1.1, 3.6]), abs=1e-3)
    assert s["min_case_speedup"] == pytest.approx(1.1, abs=1e-3)
    assert s["speedup_vs_family_plain"] == pytest.approx(np.median([4.2, 3.1, 1.1, 3.6]) / 1.1, abs=1e-3)
    assert s["min_case_speedup_vs_family_plain"] == pytest.approx(1.0, abs=1e-3)
    assert s["acceptance_rate"] == pytest.approx(18 / 20)
    assert s["tokens_per_forward"] == pytest.approx(80 / 32)
    assert s["speedup_by_language"] == {"c": pytest.approx(1.1), "javascript": pytest.approx(3.6),
                                        "python": pytest.approx(3.65)}
    plain = summarize_mode("hf-plain", runs)
    assert plain["speedup_vs_plain"] == 1.0 and plain["acceptance_rate"] is None
    assert plain["p50_ms"] == pytest.approx(11_500) and plain["p95_ms"] == pytest.approx(12_850)
    assert plain["tokens_per_forward"] == 1.0


def test_goal_checks_and_draft_model_verdict():
    summary = summarize(_runs(), ["hf-plain", "none", "lookup", "model", "auto"])
    typing = {"warm_over_cold": 0.15, "cold_whole_ms": 1400.0}
    cancel = {"forwards_after_cancel_p95": 1.0}
    goals = {g["goal"].split(" (")[0]: g for g in check_goals(summary, typing, cancel)}
    assert goals["auto never slower than plain decoding of its format"]["met"] is True
    vs_hf = goals["auto decode speedup vs hf-plain fp32"]
    assert vs_hf["value"] == pytest.approx(3.35, abs=1e-2) and vs_hf["met"] is False  # the target is 4x
    assert goals["cold time to a whole suggestion, ms"]["met"] is True
    assert goals["typing: warm latency over cold"]["met"] is True
    assert goals["forwards after cancel"]["met"] is True
    assert "auto decode tok/s over llama.cpp plain" not in goals  # llama.cpp did not run
    summary["llamacpp-plain"] = dict(summary["hf-plain"], decode_tok_s=16.0)
    llama = next(g for g in check_goals(summary, typing, cancel) if "llama.cpp" in g["goal"])
    assert llama["value"] == pytest.approx(summary["auto"]["decode_tok_s"] / 16.0, abs=1e-3)
    assert llama["met"] is (llama["value"] >= 1.3)
    slow_typing = check_goals(summary, {"warm_over_cold": 0.5, "cold_whole_ms": 2000.0}, None)
    assert [g["met"] for g in slow_typing if g["goal"].startswith(("typing", "cold"))] == [False, False]
    rss = check_goals(summary, None, None, serve_rss={"fp32": 2600.0, "int8": 1200.0})
    assert [g["met"] for g in rss if "RSS" in g["goal"]] == [True]
    verdict = draft_model_verdict(summary)
    assert verdict["draft_model_pays"] is False
    assert verdict["auto_drafted_by_model_share"] == 0.0


def test_weight_format_rows_compare_with_plain_decoding_of_their_own_format():
    runs = {"hf-plain": by_case(rec("hf-plain", "a", 5.0, text="p"), rec("hf-plain", "b", 5.0, text="q")),
            "none@int8": by_case(rec("none@int8", "a", 20.0, text="P"), rec("none@int8", "b", 20.0, text="Q")),
            "auto@int8": by_case(rec("auto@int8", "a", 40.0, text="P"), rec("auto@int8", "b", 18.0, text="Q"))}
    assert family_plain("auto@int8") == "none@int8" and family_plain("auto") == "none"
    assert family_plain("hf-lookup") == "hf-plain" and split_key("lookup@bf16") == ("lookup", "bf16")
    s = summarize_mode("auto@int8", runs)
    assert s["family_plain"] == "none@int8"
    assert s["identical_rate_vs_family_plain"] == 1.0 and s["identical_rate"] == 0.0  # quantized text differs
    assert s["min_case_speedup_vs_family_plain"] == pytest.approx(0.9)
    goals = check_goals(summarize(runs, list(runs)), None, None, weights="int8")
    slowest = next(g for g in goals if "never slower" in g["goal"])
    assert slowest["goal"].startswith("auto@int8") and slowest["met"] is False
    identical = next(g for g in goals if "identical" in g["goal"])
    assert identical["met"] is True
    runs["lookup@int8"] = by_case(rec("lookup@int8", "a", 30.0, text="P"), rec("lookup@int8", "b", 30.0, text="X"))
    identical = next(g for g in check_goals(summarize(runs, list(runs)), None, None, weights="int8")
                     if "identical" in g["goal"])
    assert identical["value"] == 0.5 and identical["met"] is False


@pytest.mark.parametrize("text,expected,exact,similar", [
    ("return x + 1\nfoo()", "return x + 1", True, 1.0),
    ("return x + 1   \n", "return x + 1\n", True, 1.0),
    ("return x + 2", "return x + 1", False, 11 / 12),
    ("", "return x", False, 0.0),
    ("\n", "\n", False, 1.0),  # an empty first line is no match to count
    # at the end of a line the removed code starts with a line break: its lines up to the first with code
    ("\n    foo()\n    bar()", "\n    foo()\n    baz()", True, 0.95),
    ("\n\n    foo()", "\n\n    foo()", True, 1.0),
    ("    foo()", "\n    foo()", False, 0.9474),  # on the cursor's line, not the next
    ("\n    foo(x)", "\n    foo()", False, 0.9524),
])
def test_completion_quality_against_the_removed_code(text, expected, exact, similar):
    got_exact, got_similar = completion_quality(text, expected)
    assert got_exact is exact and got_similar == pytest.approx(similar, abs=1e-3)


def _report_data(tmp_path):
    cases = [Case(id=c, language=lang, kind="line_start", path="m.py", source="m.py", line=1, prefix="p",
                  suffix="s", expected="e") for c, lang in
             (("a", "python"), ("b", "python"), ("c", "c"), ("d", "javascript"))]
    bench = Bench(engine=None, cases=cases, settings=BenchSettings())
    bench.result.runs = _runs()
    bench.result.typing = {"cold_ms": 9000.0, "warm_ms": 900.0, "warm_over_cold": 0.1, "keystrokes": 3,
                           "prompt_tokens": [1000], "drafter": "auto", "kv_reuse_only": {}}
    bench.result.cancel = {"forwards_after_cancel_p95": 1.0, "forwards_after_cancel_max": 1, "cancelled_tries": 5}
    bench.result.skipped = {"llamacpp-plain": "llama-cpp-python is not installed"}
    return build_report_data(bench, ["hf-plain", "hf-lookup", "none", "lookup", "model", "auto"],
                             {"target": "qwen2.5-coder-0.5b", "cases": 4, "max_tokens": 48})


def test_json_has_the_documented_shape(tmp_path):
    data = _report_data(tmp_path)
    path = tmp_path / "out.json"
    write_json(data, path)
    loaded = json.loads(path.read_text())
    assert set(loaded["modes"]) == {"hf-plain", "none", "lookup", "model", "auto"}  # hf-lookup never ran
    for mode in loaded["modes"].values():
        assert set(REQUIRED_MODE_KEYS) <= set(mode)
    assert {"cold_ms", "warm_ms", "warm_over_cold"} <= set(loaded["typing"])
    assert "forwards_after_cancel_p95" in loaded["cancel"]
    assert loaded["config"]["target"] == "qwen2.5-coder-0.5b" and loaded["config"]["machine"]["cores"] >= 1
    assert len(loaded["runs"]["auto"]) == 4


def test_markdown_has_a_row_per_mode_and_the_skips(tmp_path):
    text = markdown(_report_data(tmp_path))
    rows = [line for line in text.splitlines() if line.startswith("| ") and "×" in line]
    assert [r.split("|")[1].strip() for r in rows[:5]] == ["hf-plain", "none", "lookup", "model", "auto"]
    assert "skipped `llamacpp-plain`: llama-cpp-python is not installed" in text
    assert "warm/cold 0.100" in text


def test_plot_writes_a_png(tmp_path):
    out = tmp_path / "speedup.png"
    plot(_report_data(tmp_path), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_draft_counts_from_forward_sizes():
    # prompt of 100; first forward is the prompt alone, then 1+10, 1, 1+4 new positions
    g = GenerateTiming(token_ids=list(range(12)), first_chunk_tokens=1, prefill_ms=1, first_token_ms=1,
                       decode_ms=1, total_ms=2, forward_positions=[100, 11, 1, 5], prompt_tokens=100)
    drafted, accepted = g.draft_counts(12)
    assert drafted == 14
    assert accepted == 12 - 4  # each forward yields its accepted candidates plus one token
    assert g.target_forwards_after_first == 3


def test_a_server_row_with_its_speculation_compares_with_the_same_server_without_it():
    runs = {"hf-plain": by_case(rec("hf-plain", "a", 5.0, text="p"), rec("hf-plain", "b", 5.0, text="q")),
            "remote@vllm": by_case(rec("remote@vllm", "a", 10.0, text="P"), rec("remote@vllm", "b", 10.0, text="Q")),
            "remote@vllm+ngram": by_case(rec("remote@vllm+ngram", "a", 20.0, text="P", drafted=8, accepted=6),
                                         rec("remote@vllm+ngram", "b", 12.0, text="R", drafted=4, accepted=1))}
    assert family_plain("remote@vllm+ngram") == "remote@vllm" and family_plain("remote") == "remote"
    s = summarize_mode("remote@vllm+ngram", runs)
    assert s["family_plain"] == "remote@vllm"
    assert s["identical_rate_vs_family_plain"] == 0.5  # batch shapes may change a server's text: counted
    assert s["speedup_vs_family_plain"] == pytest.approx(1.6) and s["acceptance_rate"] == pytest.approx(7 / 12, abs=1e-3)


def test_remote_servers_are_given_as_a_labelled_list():
    from bench.cli import parse_remote_list
    from decoding.errors import DraftwiseError

    assert parse_remote_list(None) == ()
    assert parse_remote_list("openai:http://h:8000/v1#m") == (("", "openai:http://h:8000/v1#m"),)
    assert parse_remote_list("vllm=openai:http://h:1/v1#m, vllm+ngram=openai:http://h:2/v1#m") == (
        ("vllm", "openai:http://h:1/v1#m"), ("vllm+ngram", "openai:http://h:2/v1#m"))
    assert parse_remote_list("llamacpp:http://h:1?a=b") == (("", "llamacpp:http://h:1?a=b"),)
    assert parse_remote_list("a=openai:http://h:1/v1?x=1,2#m,b=llamacpp:http://h:2") == (
        ("a", "openai:http://h:1/v1?x=1,2#m"), ("b", "llamacpp:http://h:2"))
    with pytest.raises(DraftwiseError, match="its own label"):
        parse_remote_list("openai:http://h:1/v1#m,openai:http://h:2/v1#m")


def test_the_json_names_no_directory_of_this_machine(tmp_path):
    from bench.report import write_json

    out = tmp_path / "run.json"
    write_json({"cases": [{"path": "pkg/mod.py", "line": 3, "source": "/home/someone/venv/pkg/mod.py"}],
                "quality_cases": [], "config": {"seed": 0}}, out)
    data = json.loads(out.read_text())
    assert data["cases"] == [{"path": "pkg/mod.py", "line": 3}] and "/home/someone" not in out.read_text()
