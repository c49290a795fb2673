"""Weight formats: quantized layers are accurate and row-exact, every format stays lossless, and
`--weights auto` picks the fastest eligible format from measurements it keeps."""
from __future__ import annotations

import json
import logging

import pytest
import torch
from torch import nn

from decoding import CompletionRequest, EngineConfig
from decoding.engine import Engine
from decoding.kernels import integer_linear, row_ops
from decoding.models import quality_gate, weights
from decoding.models.checkpoint import load_model
from decoding.models.specs import parse_model_spec
from decoding.setup.weight_choice import WORKLOADS, FormatTiming, TimingCache, WeightsChoice, choose_and_load
from decoding.runners.hf import ModelRunner
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
    """transformers' forward with quantized layers: what runs for architectures the static forward
    does not know."""
    fp32 = load_model(str(tiny_model_dir), "cpu", weights="fp32")
    int8 = weights.convert(load_model(str(tiny_model_dir), "cpu", weights="fp32").model, "int8")
    assert not any(isinstance(m, nn.Linear) for m in int8.modules())
    assert isinstance(int8.lm_head, weights.Int8Linear)
    embedding, head = int8.model.embed_tokens, int8.lm_head
    # The tiny model ties its lm_head to the embedding, as the presets do: int8 stores the matrix once.
    assert isinstance(embedding, weights.Int8Embedding)
    assert embedding.qweight.data_ptr() == head.qweight.data_ptr()
    ids = torch.tensor([[0, 5, 17, 300]])
    want = fp32.model.model.embed_tokens(ids)
    assert ((embedding(ids) - want).norm() / want.norm()).item() < 0.01
    assert weights.weight_bytes(int8) < weights.weight_bytes(fp32.model) / 3
    int4 = weights.convert(load_model(str(tiny_model_dir), "cpu", weights="fp32").model, "int4")
    assert isinstance(int4.model.embed_tokens, weights.CompactEmbedding)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_formats_load_on_the_static_forward_and_stay_close_to_fp32(tiny_model_dir, fmt):
    from decoding.models.static_decoder import StaticDecoder
    from tests.engine.healed import last_logits

    fp32 = load_model(str(tiny_model_dir), "cpu", weights="fp32")
    quantized = load_model(str(tiny_model_dir), "cpu", weights=fmt)
    assert isinstance(quantized.model, StaticDecoder) and quantized.weights == fmt
    assert quantized.dtype == weights.compute_dtype(fmt)
    ids = [(i * 37) % 300 + 10 for i in range(50)]
    want, got = last_logits(fp32.model, ids), last_logits(quantized.model, ids)
    # (a tiny model of random weights: int4's groups of 32 are coarse for it)
    assert ((got - want).norm() / want.norm()).item() < (0.05 if fmt == "int8" else 0.35)
    # weights and their scales, without the KV buffer and the rotary tables
    held = sum(b.numel() * b.element_size() for n, b in quantized.model.named_buffers()
               if n not in ("k_cache", "v_cache", "cos", "sin"))
    assert held < weights.weight_bytes(fp32.model) / (3 if fmt == "int8" else 4)


def test_an_untied_embedding_gets_its_own_int8_rows():
    torch.manual_seed(0)
    table = nn.Embedding(50, 32)
    embedding = weights.Int8Embedding.from_embedding(table)
    ids = torch.tensor([3, 49, 0])
    assert embedding.qweight.dtype == torch.int8
    assert ((embedding(ids) - table(ids)).norm() / table(ids).norm()).item() < 0.01


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_a_verify_forward_equals_one_token_steps_bit_for_bit(tiny_model_dir, fmt):
    """What makes the quantized formats lossless: every width, past a window step, and a prompt read
    in other chunks leaves the same cache."""
    from decoding.models.static_decoder import WINDOW_STEP
    from decoding.runners import runner_for

    runner = runner_for(load_model(str(tiny_model_dir), "cpu", weights=fmt), 1 << 26, probe=False)
    ids = [(i * 37) % 300 + 10 for i in range(WINDOW_STEP + 40)]
    for start in (40, WINDOW_STEP - 5):  # the second crosses into the next attention window
        runner.start([], "doc")
        runner.forward(ids[:start - 7], logits_to_keep=1)
        runner.forward(ids[start - 7:start], logits_to_keep=1)
        one_by_one = torch.cat([runner.forward([t]) for t in ids[start:start + 17]])
        for width in (2, 3, 5, 9, 17):
            runner.crop_to(start)
            assert torch.equal(runner.forward(ids[start:start + width]), one_by_one[:width]), (start, width)
        # the same prompt read in one forward, then stepped: the same rows
        runner.discard()
        runner.start([], "doc")
        runner.forward(ids[:start], logits_to_keep=1)
        assert torch.equal(runner.forward(ids[start:start + 3]), one_by_one[:3])
        runner.discard()


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_exactness_probe_decides_whether_a_format_drafts(tiny_model_dir, fmt, tmp_path, monkeypatch):
    """int8 and int4 are exact by construction, so the probe must find every width exact; the float
    formats on transformers' forward are whatever the kernels give, and a runner drafts only as wide
    as the probe found exact."""
    from decoding.runners import exactness, runner_for

    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    from decoding.models.weights import kernel

    runner = runner_for(load_model(str(tiny_model_dir), "cpu", weights=fmt), 1 << 26)
    result = runner.exactness
    assert len(result["positions"]) == 3 and set(result["per_width"]) == set(range(2, exactness.MAX_WIDTH + 1))
    # integer-exact kernels only: ATen's int4 (DRAFTWISE_ISA=portable) takes another path for several
    # rows on AMX CPUs, so however its probe went, it does not draft on a CPU
    assert runner.exact_by_construction == (fmt in ("int8", "int4") and not kernel(fmt).startswith("aten")
                                            and "+rows" in kernel(fmt))
    if runner.exact_by_construction:
        assert runner.exact_width == exactness.MAX_WIDTH and runner.verify_exact
    else:  # transformers' forward or ATen's int4: not exact by construction, so no drafting on a CPU
        assert runner.exact_width == 1 and not runner.verify_exact
        assert (result["exact_width"] > 1) == bool(runner.not_exact_why)
    widths = sorted(result["per_width"].items())
    assert all(d == 0.0 for w, d in widths if w <= result["exact_width"])
    if result["exact_width"] < exactness.MAX_WIDTH:
        assert widths[result["exact_width"] - 1][1] > 0.0  # the first inexact width is why it stopped
    # kept: a second runner reads the result instead of probing
    monkeypatch.setattr(exactness, "probe", lambda *a, **k: pytest.fail("probed again"))
    assert runner_for(load_model(str(tiny_model_dir), "cpu", weights=fmt), 1 << 26).exact_width == runner.exact_width


def incremental_greedy(engine: Engine, request: CompletionRequest, max_tokens: int) -> str:
    """Plain greedy decoding written out: the prompt in the engine's prefill chunks, then one token a
    forward, on a runner of its own over the engine's (possibly quantized) model, none of the
    engine's decoding code."""
    from decoding.runners import runner_for

    runner, prompt = runner_for(engine.models.target, 1 << 26, probe=False), HealedPrompt(engine, request)
    ids = prompt.ids
    with torch.inference_mode():
        runner.start([], "reference")
        for i in range(0, len(ids) - 1, runner.prefill_chunk):
            runner.forward(ids[i:min(i + runner.prefill_chunk, len(ids) - 1)], logits_to_keep=1)
        out, last = [], ids[-1]
        for _ in range(max_tokens):
            logits = runner.forward([last])[-1]
            last = int(prompt.limit(logits.float(), out).argmax())
            if last in engine.models.end_ids:
                break
            out.append(last)
        runner.discard()
    return prompt.text(out)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_drafter_is_lossless_at_every_weight_format(tiny_model_dir, tiny_draft_dir, fmt):
    from tests.engine.test_lossless import random_prompts

    engine = Engine(EngineConfig(target=str(tiny_model_dir), draft=str(tiny_draft_dir), drafter="model",
                                 weights=fmt, draft_weights="int8", max_tokens=40))
    engine.load()
    try:
        info = engine.info()
        assert info["weights"] == fmt
        drafting = engine.models.target_runner.verify_exact
        assert (info["drafting_off"] == "") == drafting
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
                if not drafting:
                    assert s.drafted_tokens == 0  # a format whose verify rows are inexact decodes plainly
        if drafting:
            assert info["draft_weights"] == "int8"
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
    monkeypatch.setattr("decoding.setup.weight_choice.kernel_problem", lambda fmt, device, spec=None: None)
    monkeypatch.setattr("decoding.setup.weight_choice.time_format",
                        lambda loaded: timed.append(loaded.weights) or table[loaded.weights])
    gate = lambda key: (["fp32", "bf16", "int8"], "test gate")  # int4 and gguf are faster but fail the gate
    cache = TimingCache(tmp_path / "timings.json")
    loaded, choice = choose_and_load(spec, torch.device("cpu"), "target", FakeLoaded, cache, gate)
    assert (loaded.weights, choice.format) == ("int8", "int8")
    assert {"int4", "gguf"} <= set(choice.not_eligible)
    assert "int8 1.00 s" in choice.reason and "test gate" in choice.reason
    from decoding.kernels import integer_linear

    if integer_linear.load():  # a 0.5B's step is its weights' reading: float formats cannot win, not timed
        assert timed == ["int8"] and choice.not_eligible["fp32"].startswith("not timed: a step reads four bytes")
        timed.clear()
        monkeypatch.setattr("decoding.setup.weight_choice.FLOATS_CANNOT_WIN_BYTES", 1 << 60)  # as if tiny
        cache = TimingCache(tmp_path / "timings-small.json")
        loaded, choice = choose_and_load(spec, torch.device("cpu"), "target", FakeLoaded, cache, gate)
    assert sorted(timed) == ["bf16", "fp32", "int8"] and choice.format == "int8"
    # A second start times nothing: it loads the winner only.
    timed.clear()
    loaded, choice = choose_and_load(spec, torch.device("cpu"), "target", FakeLoaded, cache, gate)
    assert timed == [] and loaded.weights == "int8"
    # A draft model may use any format: the output stays the target's.
    timed.clear()
    loaded, choice = choose_and_load(spec, torch.device("cpu"), "draft", FakeLoaded, cache, gate)
    assert timed == ["gguf", "int4"] and choice.format == "int4"


def test_a_format_whose_kernel_fails_is_skipped_with_one_log_line(tmp_path, monkeypatch, caplog):
    spec = parse_model_spec("qwen2.5-coder-0.5b")
    monkeypatch.setattr("decoding.setup.weight_choice.kernel_problem",
                        lambda fmt, device, spec=None: "no int8 kernel here" if fmt == "int8" else None)
    monkeypatch.setattr("decoding.setup.weight_choice.time_format",
                        lambda loaded: fake_timings(fp32=3.0, int8=1.0)[loaded.weights])
    with caplog.at_level(logging.WARNING):
        loaded, choice = choose_and_load(spec, torch.device("cpu"), "target", FakeLoaded,
                                         TimingCache(tmp_path / "t.json"), lambda key: (["fp32", "int8"], "gate"))
    assert choice.format == "fp32" and choice.not_eligible["int8"] == "no int8 kernel here"
    assert [r.message for r in caplog.records] == ["weights int8 skipped: no int8 kernel here"]


def test_cuda_gets_bf16_without_timing(monkeypatch):
    """No GPU here: a fake loader stands in for loading onto CUDA; only the decision is tested."""
    monkeypatch.setattr("decoding.setup.weight_choice.time_format", lambda loaded: pytest.fail("timed on CUDA"))
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


def test_the_gate_keeps_a_format_out_only_when_its_interval_says_it_loses_more_than_two_points():
    entry = {"cases": 400, "first_line_exact": {"fp32": 20.0, "int8": 17.0, "int4": 16.0},
             "versus_fp32": {"int8": {"ci95": [-5.5, -0.5]}, "int4": {"ci95": [-7.0, -2.5]}}}
    # int8's point estimate is 3 points down, but the interval reaches -0.5: no evidence it loses > 2
    assert quality_gate.verdicts(entry) == {"fp32": True, "int8": True, "int4": False}


def test_the_gates_figures_are_the_committed_runs():
    """quality_gate.MEASURED is copied from a bench run by hand: it must say what that run's JSON says."""
    import json
    from pathlib import Path

    entry = quality_gate.MEASURED["qwen2.5-coder-0.5b"]
    run = json.loads((Path(__file__).parents[2] / "docs/bench/quality-0.5b-405.json").read_text())["quality"]
    assert entry["cases"] == run["cases"] >= 400
    for fmt, figures in run["formats"].items():
        assert entry["first_line_exact"][fmt] == figures["first_line_exact"]
        assert entry["similarity"][fmt] == figures["similarity"]
        if fmt != "fp32":
            assert entry["versus_fp32"][fmt]["ci95"] == figures["versus_fp32"]["ci95"]
            assert quality_gate.verdicts(entry)[fmt] == figures["passes_gate"]


def test_paired_difference_interval_and_mcnemar():
    from bench.metrics import RunRecord, paired_difference

    def records(hits):
        return {f"c{i}": RunRecord(mode="none", case_id=f"c{i}", language="python", first_line_exact=h)
                for i, h in enumerate(hits)}

    same = records([True, False] * 50)
    tie = paired_difference(same, same)
    assert tie["difference_points"] == 0.0 and tie["ci95"] == [0.0, 0.0] and tie["mcnemar_p"] == 1.0
    worse = paired_difference(records([False] * 30 + [True, False] * 35), records([True] * 30 + [True, False] * 35))
    assert worse["difference_points"] == -30.0 and worse["ci95"][1] < -2 and worse["mcnemar_p"] < 1e-6
    assert worse["only_reference_right"] == 30 and worse["only_this_right"] == 0


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


def test_between_formats_about_as_fast_auto_picks_the_better_quality(tmp_path, monkeypatch):
    """int8 and int4 time within a few percent of each other on this project's CPU and swap places
    between starts; `auto` then takes the one the quality gate scored higher (int8 here: 17.0% first
    lines against int4's 14.6%). A clearly faster format still wins."""
    spec = parse_model_spec("qwen2.5-coder-0.5b")
    monkeypatch.setattr("decoding.setup.weight_choice.kernel_problem", lambda fmt, device, spec=None: None)
    gate = lambda key: (["fp32", "int8", "int4"], "test gate")  # noqa: E731
    for int8_s, picked in ((1.05, "int8"), (1.25, "int4")):
        table = fake_timings(fp32=5.0, int8=int8_s, int4=1.0)
        monkeypatch.setattr("decoding.setup.weight_choice.time_format", lambda loaded, table=table: table[loaded.weights])
        loaded, choice = choose_and_load(spec, torch.device("cpu"), "target", FakeLoaded,
                                         TimingCache(tmp_path / f"t{int8_s}.json"), gate)
        assert loaded.weights == choice.format == picked
        assert ("closest to fp32's quality" in choice.reason) == (picked == "int8")
    # a draft model's text never shows: speed alone decides
    loaded, choice = choose_and_load(spec, torch.device("cpu"), "draft", FakeLoaded, TimingCache(tmp_path / "d.json"), gate)
    assert choice.format == "int4"


def test_int4_on_a_kernel_whose_quantization_was_never_gated_is_not_eligible(tmp_path, monkeypatch):
    """The quality gate measured int4's fitted grids (the VNNI kernel's packing); where ATen's kernel
    runs int4 it packs min..max grids, a quality never measured: `auto` leaves it out and says why."""
    spec = parse_model_spec("qwen2.5-coder-0.5b")
    monkeypatch.setattr("decoding.setup.weight_choice.kernel_problem", lambda fmt, device, spec=None: None)
    monkeypatch.setattr("decoding.setup.weight_choice.quantization_measured", lambda fmt: fmt != "int4")
    monkeypatch.setattr("decoding.setup.weight_choice.time_format",
                        lambda loaded: fake_timings(fp32=3.0, int8=1.0, int4=0.5)[loaded.weights])
    loaded, choice = choose_and_load(spec, torch.device("cpu"), "target", FakeLoaded,
                                     TimingCache(tmp_path / "t.json"), lambda key: (["fp32", "int8", "int4"], "gate"))
    assert choice.format == "int8" and "never measured" in choice.not_eligible["int4"]


def test_kept_measurements_are_keyed_by_kernel_isa_and_forward_code(monkeypatch):
    key = weights.implementation("int8")
    fmt, kernel, isa, code = key.split("-")
    assert fmt == "int8" and kernel in ("q8+rows", "q8", "intmm+rows", "intmm") and isa and len(code) == 12
    monkeypatch.setattr(weights, "FORWARD_CODE", weights.FORWARD_CODE[1:])
    weights.code_hash.cache_clear()
    try:
        assert weights.implementation("int8") != key  # other forward code: measured again
    finally:
        weights.code_hash.cache_clear()


def test_int8_without_the_kernel_needs_an_exact_int_mm(monkeypatch):
    """Where torch's int8 matmul saturates (oneDNN without VNNI: `ATEN_CPU_CAPABILITY=avx2
    ONEDNN_MAX_CPU_ISA=AVX2` here) and draftwise's kernel is not built, int8 and int4 say so."""
    monkeypatch.setattr(weights.integer_linear, "load", lambda: False)
    monkeypatch.setattr(weights, "int_mm_exact", lambda: False)
    for fmt in ("int8", "int4"):
        assert "saturates" in weights.kernel_problem(fmt, torch.device("cpu"))
    monkeypatch.setattr(weights, "int_mm_exact", lambda: True)
    assert weights.kernel_problem("int8", torch.device("cpu")) is None


def test_the_reported_kernel_names_the_attention_path_the_decoder_runs(tiny_model_dir):
    engine = Engine(EngineConfig(target=str(tiny_model_dir), weights="int8", max_tokens=4))
    engine.load()
    try:
        model, kernel = engine.models.target.model, engine.info()["kernel"]
        assert kernel.startswith("int8-") and ("+rows" in kernel) == model.attention_kernel
        # the tiny model's 16-wide heads run on the kernel wherever it is built (a head size it lacks:
        # tests/engine/test_exact_or_off.py)
        assert model.attention_kernel == (row_ops.problem() is None)
    finally:
        engine.close()


@pytest.mark.skipif(not integer_linear.load(), reason=f"int4 kernel: {integer_linear.problem()}")
def test_packing_lays_out_each_groups_fitted_grid_and_codes():
    """pack() puts the kernel's fit (grid_fit.h: tests/engine/test_integer_kernels.py checks its grids)
    in q4_linear's layout: unpacked, every weight is its group's code times its scale plus its low."""
    torch.manual_seed(1)
    weight = torch.randn(160, 2016) * 0.02
    n, k = weight.shape
    scale, low, codes = torch.ops.draftwise.fit_int4_grids(weight.reshape(-1, 32).contiguous(), integer_linear.REFITS)
    packed, scales, lows = integer_linear.pack(weight)
    per_block = lambda t: t.half().reshape(n // 16, 16, k // 32).permute(0, 2, 1)  # noqa: E731
    assert torch.equal(scales, per_block(scale)) and torch.equal(lows, per_block(low))
    assert torch.equal(integer_linear.unpack(packed, scales, lows),
                       (codes.float() * scale[:, None] + low[:, None]).reshape(n, k))


def test_a_first_start_times_quantized_formats_on_stand_ins_and_quantizes_only_the_winner(tiny_model_dir, tmp_path,
                                                                                       monkeypatch):
    """A quantized format is timed on a stand-in of the model's shapes with zeros for weights (no
    checkpoint read, no quantizing); the checkpoint is quantized once, in the format that serves."""
    from decoding.models import checkpoint
    from decoding.setup import weight_choice

    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    quantized, timed = [], []
    real_quantized, real_time = checkpoint._quantized, weight_choice.time_format
    monkeypatch.setattr(checkpoint, "_quantized", lambda model, fmt, *a, **k: quantized.append(fmt) or real_quantized(model, fmt, *a, **k))
    monkeypatch.setattr(weight_choice, "time_format",
                        lambda loaded: timed.append((loaded.weights, loaded.tokenizer is None)) or real_time(loaded))
    loaded, choice = weight_choice.load_weights(str(tiny_model_dir), "auto", "cpu", "auto", False, "target")
    stand_ins = [fmt for fmt, stand_in in timed if stand_in]
    assert {"int8", "int4"} & set(choice.timings) and set(stand_ins) == {"int8", "int4"} & set(choice.timings)
    assert all(not stand_in for fmt, stand_in in timed if fmt not in ("int8", "int4"))  # floats: the real model
    assert quantized == ([choice.format] if choice.format in ("int8", "int4") else [])
    assert loaded.weights == choice.format and loaded.tokenizer is not None


def test_a_winner_timed_on_its_stand_in_that_fails_to_load_gives_way_to_the_next(tmp_path, monkeypatch, caplog):
    """The stand-in timed int4 fastest, but quantizing the real model fails (out of memory, say): the
    start serves int8, with one log line, and keeps int4's timing for a later start to try again."""
    spec = parse_model_spec("qwen2.5-coder-0.5b")
    monkeypatch.setattr("decoding.setup.weight_choice.kernel_problem", lambda fmt, device, spec=None: None)
    monkeypatch.setattr("decoding.setup.weight_choice.time_format",
                        lambda loaded: fake_timings(int8=1.0, int4=0.5)[loaded.weights])

    def load(fmt):
        if fmt == "int4":
            raise MemoryError("no room to quantize")
        return FakeLoaded(fmt)

    cache = TimingCache(tmp_path / "t.json")
    with caplog.at_level(logging.WARNING):
        loaded, choice = choose_and_load(spec, torch.device("cpu"), "target", load, cache,
                                         lambda key: (["int8", "int4"], "gate"), stand_in=FakeLoaded)
    assert (loaded.weights, choice.format) == ("int8", "int8")
    assert choice.not_eligible["int4"] == "failed to load: MemoryError"
    assert [r.message for r in caplog.records] == ["weights int4 skipped: loading failed: MemoryError: no room to quantize"]
    assert set(cache.get(next(iter(json.loads((tmp_path / "t.json").read_text()))))) == {"int8", "int4"}
