"""`draftwise bench --llama-server ...`: the variants, the flags each gives llama-server, the timing
read from the server's own `timings`, and the rows' place in the summary and the goals.

The rows against a real llama-server run in tests/remote/test_remote_llama_server.py (it needs the
binary `make setup-llama-server` builds)."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.llama_server import Variant, parse_variants, timing_from_server
from bench.metrics import RunRecord, check_goals, family_plain, summarize, summarize_mode


def rec(mode, case, tok_s, text="x"):
    return RunRecord(mode=mode, case_id=case, language="python", text=text, generated_tokens=21, decode_tokens=20,
                     decode_ms=20 / tok_s * 1000, total_ms=1000.0, target_forwards=20)


def test_variants_parse_in_order_without_repeats():
    assert parse_variants(None) == ()
    assert parse_variants("plain, ngram-mod,plain,draft:8,draft") == (
        Variant("plain"), Variant("ngram-mod"), Variant("draft", 8), Variant("draft"))
    assert [v.label for v in parse_variants("ngram-simple,draft:4")] == ["ngram-simple", "draft:4"]


@pytest.mark.parametrize("bad", ["lookup", "plain:3", "draft:0", "draft:x", "ngram-mod:8"])
def test_a_bad_variant_is_refused_with_what_is_allowed(bad):
    with pytest.raises(ValueError, match="--llama-server"):
        parse_variants(bad)


def test_each_variant_gives_llama_server_its_own_flags():
    draft = Path("/models/draft.gguf")
    assert Variant("plain").flags(None) == []
    assert Variant("ngram-mod").flags(None) == ["--spec-type", "ngram-mod"]
    assert Variant("draft").flags(draft) == ["-md", str(draft), "--spec-type", "draft-simple"]
    assert Variant("draft", 8).flags(draft)[-2:] == ["--spec-draft-n-max", "8"]
    with pytest.raises(ValueError, match="draft model"):
        Variant("draft").flags(None)
    target = Path("/models/target.gguf")
    assert [Variant(v).model(target, draft) for v in ("plain", "draft")] == [target, target]
    assert Variant("draft-plain").model(target, draft) == draft and Variant("draft-plain").flags(draft) == []
    with pytest.raises(ValueError, match="draft model"):
        Variant("draft-plain").model(target, None)


def test_timing_is_the_servers_own_clock_after_the_first_token():
    # a real last event's `timings` from llama-server with ngram-mod (values rounded)
    server = {"prompt_n": 812, "prompt_ms": 3702.4, "predicted_n": 48, "predicted_ms": 1093.6,
              "draft_n": 30, "draft_n_accepted": 21, "tokens_predicted": 48, "cache_n": 0}
    t = timing_from_server(server, speculative=True)
    assert t == {"decode_tokens": 47, "decode_ms": 1093.6, "prefill_ms": 3702.4, "reused_prompt_tokens": 0,
                 "prefill_tokens": 812, "drafted_tokens": 30, "accepted_tokens": 21, "target_forwards": 26}
    # a whole accepted draft is counted before the server stops at the limit: no more than it kept
    capped = timing_from_server({"predicted_n": 5, "predicted_ms": 100.0, "draft_n": 8, "draft_n_accepted": 8}, True)
    assert capped["accepted_tokens"] == 4 and capped["target_forwards"] == 1
    plain = timing_from_server({"predicted_n": 10, "predicted_ms": 300.0, "prompt_ms": 50.0}, speculative=False)
    assert plain["drafted_tokens"] is None and plain["target_forwards"] == 9
    # a speculative server that found nothing to draft leaves draft_n out: none drafted
    idle = timing_from_server({"predicted_n": 10, "predicted_ms": 300.0}, speculative=True)
    assert idle["drafted_tokens"] == 0 and idle["accepted_tokens"] == 0 and idle["prefill_ms"] == 0.0
    assert timing_from_server({}, True) is None and timing_from_server({"predicted_n": 0, "predicted_ms": 1.0}, True) is None


def test_a_speculative_row_compares_with_the_plain_server_and_auto_is_held_against_both():
    runs = {"hf-plain": {c: rec("hf-plain", c, 5.0) for c in "ab"},
            "none@int8": {c: rec("none@int8", c, 40.0, "P") for c in "ab"},
            "auto@int8": {c: rec("auto@int8", c, 60.0, "P") for c in "ab"},
            "llama-server@plain": {c: rec("llama-server@plain", c, 40.0, "L") for c in "ab"},
            "llama-server@ngram-mod": {"a": rec("llama-server@ngram-mod", "a", 50.0, "L"),
                                       "b": rec("llama-server@ngram-mod", "b", 50.0, "changed")},
            "llama-server@draft:8": {c: rec("llama-server@draft:8", c, 30.0, "L") for c in "ab"}}
    assert family_plain("llama-server@ngram-mod") == "llama-server@plain"
    assert family_plain("llama-server@plain") == "llama-server@plain"
    s = summarize_mode("llama-server@ngram-mod", runs)
    assert s["identical_rate_vs_family_plain"] == 0.5 and s["speedup_vs_family_plain"] == pytest.approx(1.25)
    goals = [g for g in check_goals(summarize(runs, list(runs)), None, None, weights="int8", llama_goal=1.4)
             if "llama-server" in g["goal"]]
    over_plain, over_best = goals
    assert "over llama-server@plain" in over_plain["goal"]
    assert over_plain["value"] == 1.5 and over_plain["target"] == ">= 1.4" and over_plain["met"] is True
    assert "over llama-server@ngram-mod" in over_best["goal"] and "draft:8" in over_best["goal"]
    assert over_best["value"] == 1.2 and over_best["target"] == ">= 1.3" and over_best["met"] is False


def test_the_draft_models_own_plain_row_is_the_moonshot_bar_and_no_speculation_peer():
    """--llama-server draft-plain: llama.cpp decoding the small model plainly. auto on the bigger
    target is held against it at 1.0x; it is its own plain row (its text is another model's) and
    never the 'fastest speculation' peer, however fast it is."""
    runs = {"hf-plain": {c: rec("hf-plain", c, 5.0) for c in "ab"},
            "none@int4": {c: rec("none@int4", c, 17.0, "P") for c in "ab"},
            "auto@int4": {c: rec("auto@int4", c, 30.0, "P") for c in "ab"},
            "llama-server@plain": {c: rec("llama-server@plain", c, 15.0, "L") for c in "ab"},
            "llama-server@ngram-mod": {c: rec("llama-server@ngram-mod", c, 16.0, "L") for c in "ab"},
            "llama-server@draft-plain": {c: rec("llama-server@draft-plain", c, 40.0, "small") for c in "ab"}}
    assert family_plain("llama-server@draft-plain") == "llama-server@draft-plain"
    summary = summarize(runs, list(runs))
    assert summary["llama-server@draft-plain"]["identical_rate_vs_family_plain"] == 1.0
    goals = [g for g in check_goals(summary, None, None, weights="int4", llama_goal=1.5) if "llama-server" in g["goal"]]
    assert [(g["target"], g["met"]) for g in goals] == [(">= 1.5", True), (">= 1.3", True), (">= 1.0", False)]
    assert "over llama-server@ngram-mod" in goals[1]["goal"] and "draft-plain" not in goals[1]["goal"]
    assert "over llama-server@draft-plain" in goals[2]["goal"] and goals[2]["value"] == 0.75


def test_the_cli_refuses_a_bad_list_before_loading_anything():
    from bench.cli import _llama_server_variants
    from decoding.errors import DraftwiseError

    class Args:
        llama_server = "plain,sometimes"

    with pytest.raises(DraftwiseError, match="sometimes"):
        _llama_server_variants(Args, ("hf-plain", "llama-server"))
    Args.llama_server = "plain"
    with pytest.raises(DraftwiseError, match="leaves out llama-server"):
        _llama_server_variants(Args, ("hf-plain", "auto"))
    assert _llama_server_variants(Args, ("hf-plain", "llama-server")) == (Variant("plain"),)


def _bench_for(tmp_path, variants: str, binary: str | None, draft: str | None = None):
    """A Bench whose only use here is planning llama-server rows: it reads the engine's config, so the
    engine is a stand-in holding one (no model is loaded for what these tests check)."""
    from types import SimpleNamespace

    from decoding.api import EngineConfig
    from bench.harness import Bench, BenchSettings

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    engine = SimpleNamespace(config=EngineConfig(target=str(gguf), draft=draft))
    settings = BenchSettings(llama_server=parse_variants(variants), llama_server_binary=binary)
    return Bench({"int8": engine}, [], settings, target_spec=str(gguf))


def test_a_variant_that_cannot_run_is_a_skipped_row_with_why(tmp_path):
    bench = _bench_for(tmp_path, "plain,draft", binary=str(tmp_path / "missing"))
    assert bench._start_llama_servers() == []
    assert "no llama-server binary" in bench.result.skipped["llama-server@plain"]
    assert "make setup-llama-server" in bench.result.skipped["llama-server@plain"]


def test_a_server_that_dies_at_start_is_skipped_with_its_own_words_and_leaves_nothing(tmp_path):
    # a stand-in binary that fails as a broken llama-server does: a message, then exit status 1
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\necho 'error: failed to load model (stand-in)' >&2\nexit 1\n")
    binary.chmod(0o755)
    bench = _bench_for(tmp_path, "plain,draft", binary=str(binary))
    assert bench._start_llama_servers() == []
    assert "failed to load model (stand-in)" in bench.result.skipped["llama-server@plain"]
    assert "needs a draft model" in bench.result.skipped["llama-server@draft"]
    assert bench.llama_servers == {} and bench.llama_server_info["variants"] == {}
    bench.close()  # nothing to stop; safe to call
