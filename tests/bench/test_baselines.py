"""The transformers baselines and a whole (small) benchmark run, on the tiny deterministic model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.corpus import Case
from bench.harness import Bench, BenchSettings, build_report_data, completion_of
from bench.hf_baselines import cut_at_end, generate_timed
from bench.report import REQUIRED_MODE_KEYS, markdown
from decoding.models.checkpoint import load_model
from decoding.prompt import PromptBuilder, end_token_ids


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir), "cpu", "float32")


@pytest.fixture(scope="module")
def tiny_draft(tiny_draft_dir):
    return load_model(str(tiny_draft_dir), "cpu", "float32")


def _prompt(loaded) -> tuple[list[int], set[int]]:
    builder = PromptBuilder(loaded.tokenizer, 512)
    prefix = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fib"
    ids = builder.build(prefix, "\n\nclass Stack:\n    def push(self, item):\n        pass\n").ids
    return ids, end_token_ids(loaded.tokenizer, builder.template)


def _greedy_reference(model, ids: list[int], n: int, end_ids: set[int]) -> list[int]:
    """Plain argmax decoding without `generate`, recomputing the whole sequence every step."""
    seq = list(ids)
    out = []
    with torch.inference_mode():
        for _ in range(n):
            logits = model(torch.tensor([seq])).logits[0, -1]
            tok = int(torch.argmax(logits))
            out.append(tok)
            seq.append(tok)
            if tok in end_ids:
                break
    return out


def test_plain_generate_is_greedy_and_timed(tiny):
    ids, ends = _prompt(tiny)
    g = generate_timed(tiny.model, ids, 24, ends)
    assert g.token_ids == _greedy_reference(tiny.model, ids, 24, ends)
    assert g.forward_positions[0] == len(ids)  # the first forward is the prompt
    assert all(n == 1 for n in g.forward_positions[1:])
    assert g.target_forwards_after_first == len(g.token_ids) - 1
    assert g.draft_counts(len(g.token_ids)) == (0, 0)
    assert 0 < g.prefill_ms <= g.first_token_ms <= g.total_ms
    assert g.decode_ms == pytest.approx(g.total_ms - g.first_token_ms, abs=1.0)


def test_lookup_and_assisted_generate_match_plain(tiny, tiny_draft):
    ids, ends = _prompt(tiny)
    plain = generate_timed(tiny.model, ids, 24, ends)
    lookup = generate_timed(tiny.model, ids, 24, ends, prompt_lookup_num_tokens=10)
    assisted = generate_timed(tiny.model, ids, 24, ends, assistant_model=tiny_draft.model)
    assert lookup.token_ids == plain.token_ids
    assert assisted.token_ids == plain.token_ids
    drafted, accepted = assisted.draft_counts(len(assisted.token_ids))
    assert drafted >= assisted.target_forwards_after_first  # the assistant drafts at every step
    assert 0 <= accepted <= drafted


def test_both_drafting_options_at_once_is_an_error(tiny, tiny_draft):
    ids, ends = _prompt(tiny)
    with pytest.raises(ValueError, match="not both"):
        generate_timed(tiny.model, ids, 4, ends, assistant_model=tiny_draft.model, prompt_lookup_num_tokens=3)


def test_cut_at_end_keeps_the_end_token():
    assert cut_at_end([5, 6, 2, 7], {2}) == ([5, 6, 2], True)
    assert cut_at_end([5, 6], {2}) == ([5, 6], False)


class _EngineParts:
    """What completion_of reads from the loaded models: the tokenizer and end tokens (real ones here)."""

    def __init__(self, loaded):
        self.tokenizer = loaded.tokenizer
        self.end_ids = _prompt(loaded)[1]


def test_completion_of_cuts_at_the_first_end_token(tiny):
    parts = _EngineParts(tiny)
    tok = tiny.tokenizer
    body = tok.encode("x + 1", add_special_tokens=False)
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    done = completion_of(parts, body + [eos] + body)
    assert (done.text, done.useful_tokens, done.stopped) == ("x + 1", len(body) + 1, "eos")
    done = completion_of(parts, body * 3)
    assert (done.text, done.useful_tokens, done.stopped) == ("x + 1" * 3, 3 * len(body), "max_tokens")


def _cases_from_text(tmp_path: Path) -> list[Case]:
    body = "".join(f"def add_{i}(a, b):\n    total = a + b\n    return total\n\n" for i in range(60))
    src = tmp_path / "adders.py"
    src.write_text(body)
    out = []
    for i, (line, kind) in enumerate(((30, "line_start"), (90, "end_of_line"))):
        cut = sum(len(x) + 1 for x in body.split("\n")[:line]) + (4 if kind == "line_start" else 0)
        end = body.index("\n", cut + 1)
        out.append(Case(id=f"python:adders.py:{line}:{kind}", language="python", kind=kind, path="adders.py",
                        source=str(src), line=line + 1, prefix=body[:cut], suffix=body[end:], expected=body[cut:end]))
    return out


def test_small_benchmark_run_end_to_end(tiny_model_dir, tiny_draft_dir, tmp_path):
    from decoding.api import CompletionRequest, EngineConfig
    from decoding.engine import Engine

    # int8: the exact format drafts (fp32 decodes plainly); the transformers baselines run the fp32 one
    engine = Engine(EngineConfig(target=str(tiny_model_dir), draft=str(tiny_draft_dir), drafter="model",
                                 max_tokens=12, device="cpu", weights="int8", draft_weights="int8",
                                 context_tokens=256, measure_cost=False))
    reference = Engine(EngineConfig(target=str(tiny_model_dir), max_tokens=12, device="cpu", weights="fp32",
                                    context_tokens=256, measure_cost=False))
    engine.load()
    reference.load()
    try:
        settings = BenchSettings(max_tokens=12, modes=("hf-plain", "hf-lookup", "none", "lookup", "model", "auto"),
                                 typing_cases=1, keystrokes=2, typing_prompt_tokens=120, cancel_tries=2, repeats=2)
        steps = []
        cases = _cases_from_text(tmp_path)
        bench = Bench(engine, cases, settings, progress=steps.append, target_spec=str(tiny_model_dir),
                      reference=reference)
        bench.run()
        # the line-start case ends in a blank: `generate` must heal it as the engine does to match it
        assert engine.models.prompt_parts(CompletionRequest(prefix=cases[0].prefix)).healed == " "
    finally:
        engine.close()
        reference.close()
    data = build_report_data(bench, list(settings.modes), {"target": "tiny", "cases": 2, "max_tokens": 12})
    assert len(steps) == bench.steps(6)
    modes = data["modes"]
    assert list(modes) == ["hf-plain", "hf-lookup", "none", "lookup", "model", "auto"]
    for name, s in modes.items():
        assert set(REQUIRED_MODE_KEYS) <= set(s)
        assert s["errors"] == 0, (name, data["runs"][name])
        # greedy everywhere, the same prompt ids everywhere: the engine's modes write plain int8 decoding's
        # text bit for bit, transformers' lookup writes hf-plain's (the tiny model is built so that its
        # batched verification cannot flip a token)
        assert s["identical_rate_vs_family_plain"] == 1.0, name
        assert s["reused_prompt_tokens"] == 0, name  # mode comparison requests all start cold
    assert modes["model"]["drafted_by"].get("model", 0) > 0
    # a repeat must not be drafted from the suggestion the engine remembered from the run before it
    assert "suggestion" not in modes["auto"]["drafted_by"]
    assert modes["none"]["drafted_tokens"] in (None, 0)
    # the kernel that ran the engine's rows, as the engine names it; each cold engine record read its whole
    # prompt but the token its first verify forward reads
    kernel = data["config"]["kernels"]["engine"]
    assert kernel.startswith("int8-") and modes["auto"]["kernel"] == kernel and "kernel" not in modes["hf-plain"]
    for run in data["runs"]["none"] + data["runs"]["auto"]:
        assert run["prefill_tokens"] == run["prompt_tokens"] - 1, run
    assert data["prompt_reading"]["engine_best"] in ("none", "lookup", "model", "auto")
    typing = data["typing"]
    assert typing["cold_ms"] > 0 and typing["warm_ms"] > 0
    warm = [w for seq in typing["sequences"] for w in seq["warm"]]
    assert warm and all(w["reused_prompt_tokens"] > 0 for w in warm)  # the keystrokes reuse the KV cache
    assert data["cancel"]["tries"] and all(t["forwards_after_cancel"] <= 1 for t in data["cancel"]["tries"])
    json.dumps(data)  # everything is serialisable
    assert "| auto |" in markdown(data)


def test_gguf_lookup_for_targets(tiny_model_dir):
    from bench.llamacpp_baselines import gguf_for

    assert gguf_for(str(tiny_model_dir)) is None  # a directory without a .gguf file


def test_llamacpp_probe_reports_a_bad_model_file_instead_of_crashing(tmp_path):
    pytest.importorskip("llama_cpp")
    from bench.harness import llamacpp_probe

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    why = llamacpp_probe(str(bad))
    assert why is not None and why.startswith("llama.cpp")


def test_llamacpp_worker_reports_errors_from_its_process(tmp_path):
    pytest.importorskip("llama_cpp")
    from bench.llamacpp_baselines import LlamaCppWorker

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    worker = LlamaCppWorker(bad, 256, 10)
    try:
        with pytest.raises(RuntimeError, match="llama.cpp"):
            worker.generate(False, [1, 2, 3], 4, {0})
        assert worker.proc.poll() is None  # the failure was reported, the process lives on
    finally:
        worker.close()
    assert worker.proc.returncode == 0


def test_every_mode_runs_at_each_weight_format_with_quality(tiny_model_dir, tmp_path):
    from decoding.api import EngineConfig
    from bench.cli import parse_formats
    from decoding.engine import Engine

    assert parse_formats("auto,int8,int8") == ["auto", "int8"]
    with pytest.raises(Exception, match="unknown weights int3"):
        parse_formats("fp32,int3")
    engines = {}
    for fmt in ("int8", "fp32"):  # the first is the one typing and cancel use, as `auto`'s pick is
        engines[fmt] = Engine(EngineConfig(target=str(tiny_model_dir), weights=fmt, max_tokens=8, context_tokens=256,
                                           measure_cost=False))
        engines[fmt].load()
    cases = _cases_from_text(tmp_path)
    try:
        settings = BenchSettings(max_tokens=8, modes=("hf-plain", "none", "auto"), typing_cases=0, cancel_tries=0)
        bench = Bench(engines, cases[:1], settings, target_spec=str(tiny_model_dir), quality_cases=cases[1:])
        bench.run()
    finally:
        for e in engines.values():
            e.close()
    data = build_report_data(bench, list(settings.modes), {"target": "tiny", "cases": 1, "max_tokens": 8})
    assert set(data["modes"]) == {"hf-plain", "none@int8", "none@fp32", "auto@int8", "auto@fp32"}
    assert data["modes"]["auto@int8"]["family_plain"] == "none@int8"
    for key in ("auto@int8", "auto@fp32"):
        assert data["modes"][key]["identical_rate_vs_family_plain"] == 1.0
    assert data["modes"]["none@fp32"]["identical_rate"] == 1.0  # fp32 is hf-plain's own weights
    q = data["quality"]["formats"]
    assert set(q) == {"fp32", "int8"} and q["fp32"]["quality_cases"] == 2 and q["fp32"]["drop_points"] == 0.0
    assert "passes_gate" in q["int8"] and data["quality_runs"]["int8"][0]["first_line_exact"] is not None
    report = markdown(data)
    assert "| auto@int8 |" in report and "| int8 | 2 |" in report
