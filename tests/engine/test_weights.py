"""Weight formats: quantized layers are accurate and row-exact, every format stays lossless, and
`--weights auto` picks the fastest eligible format from measurements it keeps."""
from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from decoding import CompletionRequest, EngineConfig
from decoding.engine import Engine
from decoding.models import quality_gate, weights
from decoding.models.loading import load_model
from decoding.models.specs import parse_model_spec
from decoding.models.weight_choice import WORKLOADS, FormatTiming, TimingCache, WeightsChoice, choose_and_load
from decoding.runner import ModelRunner
from tests.engine.healed import HealedPrompt

FORMATS = ("fp32", "bf16", "int8", "int4")


@pytest.mark.parametrize("make,tolerance", [(weights.Int8Linear.from_linear, 0.03),
                                            (weights.Int4Linear.from_linear, 0.15)])
def test_quantized_linear_is_close_to_fp32_and_computes_each_row_alone(make, tolerance):
    torch.manual_seed(0)
    dense = nn.Linear(256, 96)
    q = make(dense)
    x = torch.randn(9, 256)
    want = dense(x)
    got = q(x.to(weights.compute_dtype("int4" if isinstance(q, weights.Int4Linear) else "int8"))).float()
    assert ((got - want).norm() / want.norm()).item() < tolerance
    # A verify forward (9 rows) gives each row bit for bit what a one-row forward gives.
    xs = x.to(got.dtype) if isinstance(q, weights.Int8Linear) else x.bfloat16()
    assert torch.equal(q(xs), torch.cat([q(xs[i:i + 1]) for i in range(9)]))


def test_convert_quantizes_every_linear_and_lm_head_and_shrinks_the_model(tiny_model_dir):
    fp32 = load_model(str(tiny_model_dir), "cpu", weights="fp32")
    int8 = load_model(str(tiny_model_dir), "cpu", weights="int8")
    assert not any(isinstance(m, nn.Linear) for m in int8.model.modules())
    assert isinstance(int8.model.lm_head, weights.Int8Linear)
    embedding, head = int8.model.model.embed_tokens, int8.model.lm_head
    # The tiny model ties its lm_head to the embedding, as the presets do: int8 stores the matrix once.
    assert isinstance(embedding, weights.Int8Embedding)
    assert embedding.qweight.data_ptr() == head.qweight.data_ptr()
    ids = torch.tensor([[0, 5, 17, 300]])
    want = fp32.model.model.embed_tokens(ids)
    assert ((embedding(ids) - want).norm() / want.norm()).item() < 0.01
    assert int8.weights == "int8" and int8.dtype == torch.float32
    assert weights.weight_bytes(int8.model) < weights.weight_bytes(fp32.model) / 3
    assert isinstance(load_model(str(tiny_model_dir), "cpu", weights="int4").model.model.embed_tokens,
                      weights.CompactEmbedding)


def test_an_untied_embedding_gets_its_own_int8_rows():
    torch.manual_seed(0)
    table = nn.Embedding(50, 32)
    embedding = weights.Int8Embedding.from_embedding(table)
    ids = torch.tensor([3, 49, 0])
    assert embedding.qweight.dtype == torch.int8
    assert ((embedding(ids) - table(ids)).norm() / table(ids).norm()).item() < 0.01


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_a_verify_forward_equals_one_token_steps_bit_for_bit(tiny_model_dir, fmt):
    """What makes the quantized formats lossless; without the row-exact attention it fails."""
    loaded = load_model(str(tiny_model_dir), "cpu", weights=fmt)
    runner = ModelRunner(loaded, 1 << 26)
    ids = [(i * 37) % 300 + 10 for i in range(60)]
    with torch.inference_mode():
        runner.start([], "doc")
        runner.forward(ids[:40], logits_to_keep=1)
        together = runner.forward(ids[40:49])
        runner.crop_to(40)
        one_by_one = torch.cat([runner.forward([t]) for t in ids[40:49]])
    assert torch.equal(together, one_by_one)


def incremental_greedy(engine: Engine, request: CompletionRequest, max_tokens: int) -> str:
    """Plain greedy decoding written out: the prompt in the engine's prefill chunks, then one token a
    forward, on the engine's (possibly quantized) model but none of its decoding code."""
    from transformers import DynamicCache

    from decoding.runner import PREFILL_CHUNK

    model, prompt = engine.models.target.model, HealedPrompt(engine, request)
    ids = prompt.ids
    cache_kw = ModelRunner(engine.models.target, 0)._cache_kw  # transformers renamed past_key_values to cache
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        for i in range(0, len(ids) - 1, PREFILL_CHUNK):
            model(input_ids=torch.tensor([ids[i:min(i + PREFILL_CHUNK, len(ids) - 1)]]), use_cache=True,
                  logits_to_keep=1, **{cache_kw: cache})
        out, last = [], ids[-1]
        for _ in range(max_tokens):
            logits = model(input_ids=torch.tensor([[last]]), use_cache=True, **{cache_kw: cache}).logits[0, -1]
            last = int(prompt.limit(logits.float(), out).argmax())
            if last in engine.models.end_ids:
                break
            out.append(last)
    return prompt.text(out)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_drafter_is_lossless_at_every_weight_format(tiny_model_dir, tiny_draft_dir, fmt):
    from tests.engine.test_lossless import random_prompts

    engine = Engine(EngineConfig(target=str(tiny_model_dir), draft=str(tiny_draft_dir), drafter="model",
                                 weights=fmt, draft_weights="int8", max_tokens=40))
    engine.load()
    try:
        assert engine.info()["weights"] == fmt and engine.info()["draft_weights"] == "int8"
        partial = 0
        for i, (prefix, suffix) in enumerate(random_prompts(10, seed=11)):
            base = CompletionRequest(prefix=prefix, suffix=suffix, scope="full", max_tokens=40)
            expected = incremental_greedy(engine, base, 40)
            for mode in ("none", "lookup", "model", "auto"):
                result = engine.complete(CompletionRequest(prefix=prefix, suffix=suffix, scope="full", max_tokens=40,
                                                           drafter=mode, document=f"{fmt}-{i}-{mode}"))
                assert result.text == expected, f"{fmt}, prompt {i}, drafter {mode}"
                s = result.stats
                partial += mode == "model" and 0 < s.accepted_tokens < s.drafted_tokens
        assert partial >= 3  # drafts were partly accepted, not only all or nothing
    finally:
        engine.close()


# ---- choosing a format ---------------------------------------------------------------------------

class FakeLoaded:
    def __init__(self, fmt):
        self.weights = fmt


def fake_timings(**reference_s):
    """Timings whose reference requests take the given seconds on average (prompt reading only)."""
    read = sum(w["share"] * w["prompt_tokens"] for w in WORKLOADS.values())
    return {f: FormatTiming(decode_ms=1.0, verify_ms=0.0, prefill_tok_s=read / s) for f, s in reference_s.items()}


def test_the_reference_weighs_requests_while_typing_over_cold_reads():
    """Timings measured on this project's 2-core CPU (bf16: fast prompt reading, slow decoding;
    gguf: the reverse, and no drafting). A cold 1,000-token request alone favours bf16; the
    requests users mostly wait for (while typing: a short re-read, a line or two) favour gguf."""
    bf16 = FormatTiming(decode_ms=75.96, verify_ms=88.34, prefill_tok_s=386.3)
    gguf = FormatTiming(decode_ms=19.43, verify_ms=66.05, prefill_tok_s=241.7, drafts=False)
    cold, typing = WORKLOADS["cold"], WORKLOADS["typing"]
    assert bf16.request_s(cold["prompt_tokens"], cold["new_tokens"]) < gguf.request_s(cold["prompt_tokens"], cold["new_tokens"])
    assert gguf.request_s(typing["prompt_tokens"], typing["new_tokens"]) < bf16.request_s(typing["prompt_tokens"], typing["new_tokens"])
    assert gguf.reference_s < bf16.reference_s
    assert sum(w["share"] for w in WORKLOADS.values()) == pytest.approx(1.0)


def test_auto_picks_the_fastest_eligible_format_and_keeps_its_timings(tmp_path, monkeypatch):
    spec = parse_model_spec("qwen2.5-coder-0.5b")
    table = fake_timings(fp32=5.0, bf16=2.0, int8=1.0, int4=0.5, gguf=0.8)
    timed: list[str] = []
    monkeypatch.setattr("decoding.models.weight_choice.kernel_problem", lambda fmt, device, spec=None: None)
    monkeypatch.setattr("decoding.models.weight_choice.time_format",
                        lambda loaded: timed.append(loaded.weights) or table[loaded.weights])
    gate = lambda key: (["fp32", "bf16", "int8"], "test gate")  # int4 and gguf are faster but fail the gate
    cache = TimingCache(tmp_path / "timings.json")
    loaded, choice = choose_and_load(spec, torch.device("cpu"), "target", FakeLoaded, cache, gate)
    assert (loaded.weights, choice.format) == ("int8", "int8")
    assert sorted(timed) == ["bf16", "fp32", "int8"] and {"int4", "gguf"} <= set(choice.not_eligible)
    assert "int8 1.00 s" in choice.reason and "test gate" in choice.reason
    # A second start times nothing: it loads the winner only.
    timed.clear()
    loaded, choice = choose_and_load(spec, torch.device("cpu"), "target", FakeLoaded, cache, gate)
    assert timed == [] and loaded.weights == "int8"
    # A draft model may use any format: the output stays the target's.
    timed.clear()
    loaded, choice = choose_and_load(spec, torch.device("cpu"), "draft", FakeLoaded, cache, gate)
    assert timed == ["int4", "gguf"] and choice.format == "int4"


def test_a_format_whose_kernel_fails_is_skipped_with_one_log_line(tmp_path, monkeypatch, caplog):
    spec = parse_model_spec("qwen2.5-coder-0.5b")
    monkeypatch.setattr("decoding.models.weight_choice.kernel_problem",
                        lambda fmt, device, spec=None: "no int8 kernel here" if fmt == "int8" else None)
    monkeypatch.setattr("decoding.models.weight_choice.time_format",
                        lambda loaded: fake_timings(fp32=3.0, int8=1.0)[loaded.weights])
    with caplog.at_level(logging.WARNING):
        loaded, choice = choose_and_load(spec, torch.device("cpu"), "target", FakeLoaded,
                                         TimingCache(tmp_path / "t.json"), lambda key: (["fp32", "int8"], "gate"))
    assert choice.format == "fp32" and choice.not_eligible["int8"] == "no int8 kernel here"
    assert [r.message for r in caplog.records] == ["weights int8 skipped: no int8 kernel here"]


def test_cuda_gets_bf16_without_timing(monkeypatch):
    """No GPU here: a fake loader stands in for loading onto CUDA; only the decision is tested."""
    monkeypatch.setattr("decoding.models.weight_choice.time_format", lambda loaded: pytest.fail("timed on CUDA"))
    loaded, choice = choose_and_load(parse_model_spec("qwen2.5-coder-0.5b"), torch.device("cuda"), "target",
                                     FakeLoaded)
    assert loaded.weights == choice.format == "bf16"


def test_quality_gate_verdicts():
    measured = {"a": {"cases": 200, "first_line_exact": {"fp32": 40.0, "bf16": 39.5, "int8": 38.0, "int4": 30.0}},
                "b": {"cases": 200, "first_line_exact": {"fp32": 50.0, "int8": 47.5, "bf16": 50.0}}}
    assert quality_gate.eligible_formats("a", measured)[0] == ["fp32", "bf16", "int8"]
    assert quality_gate.eligible_formats("b", measured)[0] == ["fp32", "bf16"]
    passed, why = quality_gate.eligible_formats("unmeasured", measured)
    assert passed == ["fp32", "bf16"] and "every measured model" in why
    assert quality_gate.eligible_formats("x", {})[0] == ["fp32"]


def test_engine_reports_the_weights_it_chose(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    monkeypatch.setattr(quality_gate, "MEASURED", {"m": {"cases": 100, "first_line_exact": {"fp32": 40.0, "int8": 39.0}}})
    engine = Engine(EngineConfig(target=str(tiny_model_dir), weights="auto"))
    engine.load()
    try:
        info = engine.info()
        assert info["weights"] in ("fp32", "int8") and info["weights_choice"]["format"] == info["weights"]
        assert set(info["weights_choice"]["timings"]) == {"fp32", "int8"}
        assert (tmp_path / "weight-timings.json").is_file()
        assert engine.complete(CompletionRequest(prefix="def f(x):\n", max_tokens=4)).stats.generated_tokens >= 0
    finally:
        engine.close()


def test_an_unknown_weight_format_is_a_clear_error(tiny_model_dir):
    engine = Engine(EngineConfig(target=str(tiny_model_dir), weights="int3"))
    with pytest.raises(Exception, match="unknown weights 'int3'"):
        engine.load()
    engine.close()


def test_weights_choice_serializes():
    choice = WeightsChoice("int8", "why", fake_timings(int8=1.0))
    assert choice.to_dict()["timings"]["int8"]["reference_s"] == pytest.approx(1.0)
