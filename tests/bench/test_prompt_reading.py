"""Prompt reading per row (tokens read per second of prefill) beside llama-server's, the kernel the
engine's rows ran on, and llama-server's plain row on requantized GGUFs (`--llama-server-quants`):
the summaries, the report's lines, and the requantizing plumbing.

llama-quantize itself is stood in for by a small script the tests write (the real binary takes
minutes to build: `make setup-llama-quantize`); it copies the source GGUF and sets the format its
header names, as the real one does. The real binary's test is tests/bench/test_llama_quantize_real.py
(marked `remote`, skipped without the binary)."""
from __future__ import annotations

import os
import struct
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.harness import Bench, BenchSettings, build_report_data, engine_prefill_tokens
from bench.llama_server import (
    PLAIN_ON, QUANT_TYPES, gguf_file_type, parse_quants, parse_variants, requantized_gguf, timing_from_server,
)
from bench.metrics import (
    MIN_PREFILL_TOKENS, RunRecord, check_goals, family_plain, llama_server_peer, prompt_reading, summarize,
    summarize_mode,
)
from bench.report import markdown


def rec(mode, case, *, prompt=1100, reused=0, read=None, prefill_ms=2000.0, tok_s=20.0, text="x", error=None):
    return RunRecord(mode=mode, case_id=case, language="python", text=text, prompt_tokens=prompt,
                     reused_prompt_tokens=reused, prefill_tokens=read, prefill_ms=prefill_ms, generated_tokens=21,
                     decode_tokens=20, decode_ms=20 / tok_s * 1000, total_ms=3000.0, target_forwards=20, error=error)


def rows(mode, *per_case, **kw):
    return {c: rec(mode, c, **{**kw, **extra}) for c, extra in zip("abc", per_case)}


# ---- one record, one row --------------------------------------------------------------------------

def test_a_record_reads_the_tokens_no_cache_held_over_its_prefill_time():
    # the engine's rows say what their prefill read (the prompt less the tail the first verify reads)
    assert rec("none@int8", "a", prompt=1101, read=1100, prefill_ms=2000.0).prompt_read_tok_s == pytest.approx(550.0)
    # else the prompt less what a cache held
    assert rec("remote", "a", prompt=1000, reused=200, prefill_ms=400.0).prompt_read_tok_s == pytest.approx(2000.0)
    assert rec("remote", "a", prompt=1000, reused=200).prompt_read_tokens == 800
    # a handful of tokens read times a forward's fixed cost, not reading; nor does a failed or untimed run say
    assert rec("none@int8", "a", prompt=MIN_PREFILL_TOKENS + 5, reused=6).prompt_read_tok_s is None
    assert rec("none@int8", "a", error="boom").prompt_read_tok_s is None
    assert rec("none@int8", "a", prefill_ms=0.0).prompt_read_tok_s is None
    assert rec("none@int8", "a", read=1100).to_dict()["prompt_read_tok_s"] == 550.0


def test_llama_servers_prompt_reading_is_its_prompt_n_in_its_prompt_ms():
    # a real last event's timings (values rounded): /infill built a 1,207-token prompt, none cached
    t = timing_from_server({"prompt_n": 1207, "prompt_ms": 6035.0, "predicted_n": 24, "predicted_ms": 1300.0,
                            "cache_n": 0}, speculative=False)
    assert t["prefill_tokens"] == 1207 and t["prefill_ms"] == 6035.0
    record = rec("llama-server@plain", "a", prompt=1207)
    for name, value in t.items():
        setattr(record, name, value)
    assert record.prompt_read_tok_s == pytest.approx(200.0)
    # a server that does not say leaves the count to the prompt less its cache
    assert timing_from_server({"predicted_n": 5, "predicted_ms": 10.0}, False)["prefill_tokens"] is None


@pytest.mark.parametrize("tail,prompt,reused,read", [
    (1, 1101, 0, 1100),  # the static forward: all but the token its first verify forward reads
    (16, 1101, 0, 1085),  # llama.cpp's runner leaves up to 16
    (1, 1101, 1090, 10),  # a warm cache: only what it lacked
    (1, 1101, 1101, 0),  # the whole prompt cached: the last token is still read by the first forward
    (16, 10, 0, 0),  # a prompt shorter than the tail: the first forward reads it all
])
def test_the_engines_prefill_count_leaves_out_the_tail_its_first_forward_reads(tail, prompt, reused, read):
    engine = SimpleNamespace(models=SimpleNamespace(target_runner=SimpleNamespace(prompt_tail=tail)))
    assert engine_prefill_tokens(engine, rec("none@int8", "a", prompt=prompt, reused=reused)) == read


# ---- the summary and the peer ---------------------------------------------------------------------

def _runs():
    return {
        "hf-plain": rows("hf-plain", {}, {}, {}, prefill_ms=5000.0, tok_s=5.0),
        # 1,100 tokens read in 2.0 / 2.2 / 4.0 s: median 500 tok/s
        "none@int8": rows("none@int8", {"prefill_ms": 2000.0}, {"prefill_ms": 2200.0}, {"prefill_ms": 4000.0}, read=1100),
        "auto@int8": rows("auto@int8", {}, {}, {}, read=1100, prefill_ms=2750.0, tok_s=40.0),
        "none@int4": rows("none@int4", {}, {}, {}, read=1100, prefill_ms=2420.0),
        # llama.cpp: Q4_K_M (shipped) reads at 200 and decodes at 18; Q4_0 reads at 250, decodes at 21;
        # Q8_0 reads at 300 (the best reader) and decodes at 16
        "llama-server@plain": rows("llama-server@plain", {}, {}, {}, prompt=1200, read=1200, prefill_ms=6000.0,
                                   tok_s=18.0, text="L"),
        "llama-server@ngram-mod": rows("llama-server@ngram-mod", {}, {}, {}, prompt=1200, read=1200,
                                       prefill_ms=6000.0, tok_s=19.0, text="L"),
        "llama-server@plain:q4_0": rows("llama-server@plain:q4_0", {}, {}, {}, prompt=1200, read=1200,
                                        prefill_ms=4800.0, tok_s=21.0, text="other"),
        "llama-server@plain:q8_0": rows("llama-server@plain:q8_0", {}, {}, {}, prompt=1200, read=1200,
                                        prefill_ms=4000.0, tok_s=16.0, text="L"),
    }


def test_each_row_reports_its_median_prompt_reading():
    s = summarize_mode("none@int8", _runs())
    assert s["prompt_read_tok_s"] == 500.0 and s["prompt_read_tokens_median"] == 1100
    assert summarize_mode("llama-server@plain", _runs())["prompt_read_tok_s"] == 200.0


def test_the_engines_best_row_is_held_against_llamas_fastest_reader_and_says_which():
    summary = summarize(_runs(), list(_runs()))
    pr = prompt_reading(summary)
    assert pr["engine_best"] == "none@int8"  # 500 tok/s, over int4's 454.5 and auto@int8's 400
    assert pr["peer"] == "llama-server@plain:q8_0"  # the best reader of the three plain rows
    assert pr["peer_of"] == ["llama-server@plain", "llama-server@plain:q4_0", "llama-server@plain:q8_0"]
    assert pr["engine_over_peer"] == pytest.approx(500 / 300, abs=1e-3)
    assert pr["rows"]["llama-server@plain"]["over_peer"] == pytest.approx(200 / 300, abs=1e-3)
    assert "hf-plain" in pr["rows"] and "llama-server@ngram-mod" in pr["rows"]


def test_without_quants_the_peer_is_the_plain_server_row_as_before():
    runs = {k: v for k, v in _runs().items() if PLAIN_ON not in k}
    summary = summarize(runs, list(runs))
    pr = prompt_reading(summary)
    assert pr["peer"] == "llama-server@plain" and pr["engine_over_peer"] == 2.5
    goals = [g for g in check_goals(summary, None, None, weights="int8") if "llama-server" in g["goal"]]
    assert [g["goal"].split(" over ")[1].split(" (")[0] for g in goals] == ["llama-server@plain", "llama-server@ngram-mod"]
    assert "llama.cpp's plain decoding, same GGUF" in goals[0]["goal"]


def test_decode_ratios_are_over_the_fastest_decoder_and_prompt_ratios_over_the_fastest_reader():
    summary = summarize(_runs(), list(_runs()))
    assert llama_server_peer(summary) == "llama-server@plain:q4_0"  # 21 tok/s, over 18 and 16
    assert llama_server_peer(summary, "prompt_read_tok_s") == "llama-server@plain:q8_0"
    goals = [g for g in check_goals(summary, None, None, weights="int8", llama_goal=1.3) if "llama-server" in g["goal"]]
    over_plain, over_spec = goals
    assert "over llama-server@plain:q4_0" in over_plain["goal"] and "fastest plain decoding" in over_plain["goal"]
    assert over_plain["value"] == pytest.approx(40 / 21, abs=1e-3)
    # the requantized rows are plain decoding: never the 'fastest speculation' peer
    assert "over llama-server@ngram-mod" in over_spec["goal"] and PLAIN_ON not in over_spec["goal"]


def test_a_requantized_row_is_its_own_plain_row():
    # its text comes from other weights: held against no other row's text, as draft-plain is
    assert family_plain("llama-server@plain:q4_0") == "llama-server@plain:q4_0"
    assert family_plain("llama-server@ngram-mod") == "llama-server@plain"
    s = summarize_mode("llama-server@plain:q4_0", _runs())
    assert s["family_plain"] == "llama-server@plain:q4_0" and s["speedup_vs_family_plain"] == 1.0


# ---- the report ----------------------------------------------------------------------------------

def _report(kernels=None):
    bench = Bench(engine=None, cases=[], settings=BenchSettings())
    bench.result.runs = _runs()
    bench.kernels = kernels if kernels is not None else {"int8": "int8-q8+rows-avx512vnni-0123abcd",
                                                         "int4": "int4-q4q8+rows-avx512vnni-0123abcd"}
    bench.llama_server_info = {"binary": "llama-server", "gguf": "m.gguf", "gguf_type": "q4_k_m", "threads": 2,
                               "variants": {}, "formats": {
                                   "llama-server@plain": {"type": "q4_k_m", "requantized": False},
                                   "llama-server@ngram-mod": {"type": "q4_k_m", "requantized": False},
                                   "llama-server@plain:q4_0": {"type": "q4_0", "requantized": True, "from": "q4_k_m"},
                                   "llama-server@plain:q8_0": {"type": "q8_0", "requantized": True, "from": "q4_k_m"}}}
    return build_report_data(bench, list(_runs()), {"target": "qwen2.5-coder-0.5b", "cases": 3, "max_tokens": 24})


def test_the_json_names_the_kernel_each_engine_row_ran_and_the_prompt_reading():
    data = _report()
    assert data["config"]["kernels"] == {"int8": "int8-q8+rows-avx512vnni-0123abcd",
                                         "int4": "int4-q4q8+rows-avx512vnni-0123abcd"}
    assert data["modes"]["auto@int8"]["kernel"] == "int8-q8+rows-avx512vnni-0123abcd"
    assert data["modes"]["none@int4"]["kernel"].startswith("int4-")
    assert "kernel" not in data["modes"]["llama-server@plain"]
    assert data["modes"]["llama-server@plain"]["gguf"] == {"type": "q4_k_m", "requantized": False}
    assert data["modes"]["llama-server@plain:q4_0"]["gguf"] == {"type": "q4_0", "requantized": True, "from": "q4_k_m"}
    assert data["prompt_reading"]["peer"] == "llama-server@plain:q8_0"
    assert data["runs"]["none@int8"][0]["prompt_read_tok_s"] == 550.0


def test_the_report_has_a_prompt_reading_row_per_row_and_names_what_won():
    text = markdown(_report())
    table = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in text.split("Prompt reading, cold")[1].split("\n\n")[1].splitlines()[2:]}
    assert table["none@int8"] == ["int8-q8+rows-avx512vnni-0123abcd", "1,100", "2,200", "500.0", "1.67×"]
    assert table["llama-server@plain"] == ["q4_k_m GGUF", "1,200", "6,000", "200.0", "0.67×"]
    assert table["llama-server@plain:q8_0"] == ["q8_0 GGUF, requantized from q4_k_m", "1,200", "4,000", "300.0", "1.00×"]
    assert table["hf-plain"][0] == "–"
    assert "| row | runs on | prompt tokens read (median) | prefill ms (median) | prompt reading tok/s | " \
           "over llama-server@plain:q8_0 |" in text
    assert ("`none@int8` reads prompts at **1.67×** the speed of `llama-server@plain:q8_0` (q8_0 GGUF, requantized "
            "from q4_k_m; llama.cpp's fastest reader here of llama-server@plain, llama-server@plain:q4_0, "
            "llama-server@plain:q8_0).") in text
    assert ("decoding `llama-server@plain:q4_0` (q4_0 GGUF, requantized from q4_k_m); prompt reading "
            "`llama-server@plain:q8_0` (q8_0 GGUF, requantized from q4_k_m)") in text
    assert "The engine's rows ran on: int8 `int8-q8+rows-avx512vnni-0123abcd`, int4 `int4-q4q8+rows" in text


def test_a_report_without_these_numbers_leaves_their_lines_out():
    data = _report(kernels={})
    data["prompt_reading"] = None
    data["config"]["llama_server"] = None
    text = markdown(data)
    assert "Prompt reading, cold" not in text and "rows ran on" not in text


# ---- requantizing --------------------------------------------------------------------------------

def write_gguf(path: Path, file_type: int | None, vocabulary: int = 50) -> Path:
    """A GGUF file by the gguf package's own writer: a string array (a tokenizer's) before the file type,
    as converted models have it, and no tensors."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"tok{i}" for i in range(vocabulary)])
    writer.add_array("test.floats", [0.5, 1.5])
    if file_type is not None:
        writer.add_file_type(file_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def stub_quantize(folder: Path, writes: str | None = None, fail: bool = False) -> Path:
    """Stands in for llama-quantize (the real one takes minutes to build): `--allow-requantize SRC DST
    TYPE [THREADS]` copies SRC to DST with the header's file type set to TYPE (or to `writes`, a binary
    that makes the wrong thing), logging each call; `fail`: it dies as a broken one does."""
    script = folder / "llama-quantize"
    script.write_text(f"""#!{sys.executable}
import struct, sys
from pathlib import Path
TYPES = {dict((k.upper(), v) for k, v in QUANT_TYPES.items())!r}
flag, src, dst, kind = sys.argv[1:5]
with open(Path(__file__).with_name("calls.log"), "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
if {fail!r}:
    print("llama_model_quantize: failed to quantize: stand-in failure", file=sys.stderr)
    sys.exit(1)
data = bytearray(Path(src).read_bytes())
at = data.index(b"general.file_type") + len(b"general.file_type") + 4
data[at:at + 4] = struct.pack("<I", TYPES[{writes!r} or kind])
Path(dst).write_bytes(bytes(data))
""")
    script.chmod(0o755)
    return script


def calls(folder: Path) -> list[str]:
    log = folder / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_the_file_type_is_read_from_the_gguf_header(tmp_path):
    assert gguf_file_type(write_gguf(tmp_path / "a.gguf", 15, vocabulary=3000)) == "q4_k_m"
    assert gguf_file_type(write_gguf(tmp_path / "b.gguf", 7)) == "q8_0"
    assert gguf_file_type(write_gguf(tmp_path / "c.gguf", 1)) == "type 1"  # f16: not a format the row takes
    assert gguf_file_type(write_gguf(tmp_path / "d.gguf", None)) is None
    (tmp_path / "e.gguf").write_bytes(b"GGUF\x03\x00")  # cut short
    (tmp_path / "f.gguf").write_bytes(b"not a model")
    assert gguf_file_type(tmp_path / "e.gguf") is None and gguf_file_type(tmp_path / "f.gguf") is None
    assert gguf_file_type(tmp_path / "missing.gguf") is None


def test_quants_parse_in_order_and_refuse_an_unknown_one():
    assert parse_quants(None) == () and parse_quants("Q4_0, q8_0,q4_0") == ("q4_0", "q8_0")
    with pytest.raises(ValueError, match="q4_k_x"):
        parse_quants("q4_k_x")


def test_a_requantized_file_is_made_once_under_the_home_and_says_its_format(tmp_path):
    source = write_gguf(tmp_path / "qwen.gguf", 15)
    tool = stub_quantize(tmp_path)
    home = tmp_path / "home"
    out = requantized_gguf(source, "q4_0", str(tool), threads=3, home=home)
    assert out == home / "gguf" / "qwen-q4_0.gguf" and gguf_file_type(out) == "q4_0"
    made = calls(tmp_path)
    assert len(made) == 1
    flag, src, dst, kind, threads = made[0].split()
    # written under a temporary name beside it, then renamed: never half a file under the kept name
    assert (flag, src, kind, threads) == ("--allow-requantize", str(source), "Q4_0", "3")
    assert Path(dst).parent == out.parent and Path(dst).name != out.name and not Path(dst).exists()
    assert requantized_gguf(source, "q4_0", str(tool), home=home) == out
    assert len(calls(tmp_path)) == 1  # kept: not made again
    os.utime(source, (out.stat().st_mtime + 10, out.stat().st_mtime + 10))  # the preset pulled again
    requantized_gguf(source, "q4_0", str(tool), home=home)
    assert len(calls(tmp_path)) == 2
    assert sorted(p.name for p in (home / "gguf").iterdir()) == ["qwen-q4_0.gguf"]


def test_a_failed_or_wrong_requantization_leaves_no_file(tmp_path):
    source = write_gguf(tmp_path / "qwen.gguf", 15)
    home = tmp_path / "home"
    with pytest.raises(RuntimeError, match="stand-in failure"):
        requantized_gguf(source, "q8_0", str(stub_quantize(tmp_path, fail=True)), home=home)
    with pytest.raises(RuntimeError, match="asked for q8_0 and wrote q4_0"):
        requantized_gguf(source, "q8_0", str(stub_quantize(tmp_path, writes="Q4_0")), home=home)
    assert list((home / "gguf").iterdir()) == []  # neither the kept name nor a temporary one


def _bench(tmp_path, monkeypatch, quants: str, quantize: Path | None, variants: str = "plain"):
    """A Bench whose only use is planning llama-server rows (see test_llama_server_rows.py): its engine is a
    stand-in holding a config; llama-server is a stand-in that fails to start as a broken one does."""
    from decoding.api import EngineConfig

    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path / "home"))
    gguf = write_gguf(tmp_path / "model.gguf", 15)
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\necho 'error: failed to load model (stand-in)' >&2\nexit 1\n")
    server.chmod(0o755)
    settings = BenchSettings(llama_server=parse_variants(variants), llama_server_binary=str(server),
                             llama_server_quants=parse_quants(quants),
                             llama_quantize_binary=str(quantize) if quantize else str(tmp_path / "missing"))
    engine = SimpleNamespace(config=EngineConfig(target=str(gguf)))
    return Bench({"int8": engine}, [], settings, target_spec=str(gguf))


def test_each_quant_but_the_shipped_one_is_requantized_and_gets_its_own_plain_row(tmp_path, monkeypatch):
    bench = _bench(tmp_path, monkeypatch, "q4_k_m,q4_0,q8_0", stub_quantize(tmp_path))
    assert bench._start_llama_servers() == []
    skipped = bench.result.skipped
    # the shipped file is Q4_K_M by its header: its row is llama-server@plain, not made again
    assert set(skipped) == {"llama-server@plain", "llama-server@plain:q4_0", "llama-server@plain:q8_0"}
    assert all("failed to load model (stand-in)" in why for why in skipped.values())
    assert bench.llama_server_info["gguf_type"] == "q4_k_m"
    made = sorted(p.name for p in (tmp_path / "home" / "gguf").iterdir())
    assert made == ["model-q4_0.gguf", "model-q8_0.gguf"] and [c.split()[3] for c in calls(tmp_path)] == ["Q4_0", "Q8_0"]
    assert bench.llama_servers == {}


def test_without_llama_quantize_the_requantized_rows_say_how_to_build_it(tmp_path, monkeypatch):
    bench = _bench(tmp_path, monkeypatch, "q8_0", quantize=None)
    bench._start_llama_servers()
    assert "make setup-llama-quantize" in bench.result.skipped["llama-server@plain:q8_0"]


def test_the_cli_wants_the_plain_variant_for_quants():
    from bench.cli import _llama_server_quants
    from decoding.errors import DraftwiseError

    with pytest.raises(DraftwiseError, match="add plain"):
        _llama_server_quants(SimpleNamespace(llama_server_quants="q4_0"), parse_variants("ngram-mod"))
    with pytest.raises(DraftwiseError, match="--llama-server-quants"):
        _llama_server_quants(SimpleNamespace(llama_server_quants="q9"), parse_variants("plain"))
    assert _llama_server_quants(SimpleNamespace(llama_server_quants="q8_0"), parse_variants("plain")) == ("q8_0",)
    assert _llama_server_quants(SimpleNamespace(), parse_variants("plain")) == ()


def test_a_requantized_row_is_timed_as_plain_decoding_by_the_servers_clock(tmp_path, monkeypatch):
    """Its row runs as llama-server@plain's does: not as speculation (no drafted tokens to count), its
    prefill and the tokens read in it from the server's own timings."""
    from decoding.api import CompletionResult, RequestStats

    class Server:
        def __init__(self):
            self.forgotten = 0

        def forget(self):
            self.forgotten += 1

    class Remote:  # the remote engine on that server: what its last request reported
        def clear_caches(self):
            pass

        def complete(self, request):
            return CompletionResult("    return a + b", RequestStats(prompt_tokens=1207, generated_tokens=24,
                                                                    prefill_ms=5900.0, decode_ms=1400.0,
                                                                    stopped="max_tokens"))

        def stats(self):
            return {"last": {"server": {"prompt_n": 1207, "prompt_ms": 6035.0, "predicted_n": 24,
                                        "predicted_ms": 1300.0, "cache_n": 0}}}

        def server_counters_now(self, names):
            return None

    bench = _bench(tmp_path, monkeypatch, "q4_0", stub_quantize(tmp_path))
    key = "llama-server@plain:q4_0"
    bench.remotes[key], bench.llama_servers[key] = Remote(), Server()
    from bench.corpus import Case

    case = Case(id="a", language="python", kind="line_start", path="m.py", source="m.py", line=1, prefix="def f(a, b):\n",
                suffix="", expected="    return a + b")
    record = bench._run_remote(case, key, "r")
    assert bench.llama_servers[key].forgotten == 1  # read cold, as every row is
    assert record.drafted_tokens is None and record.accepted_tokens is None
    assert record.prefill_tokens == 1207 and record.prefill_ms == 6035.0
    assert record.prompt_read_tok_s == pytest.approx(200.0)
