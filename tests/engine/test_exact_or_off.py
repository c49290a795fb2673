"""Exact or off, decided by what runs: drafting is on where every op of the forward that runs is
row-exact by construction (integer matmuls, attention on row_ops.cpp), and anywhere else on a CPU
every request decodes plainly, however the exactness probe went, with draftwise/stats saying why. The
probe checks a verify forward across a KV buffer resize, and leaves the buffer every start has.

The end-to-end checks run the engine in a child process: which kernels a process loads is decided once
(torch cannot unload them), and these are the builds users get: no compiler (CXX=/bin/false), the
plain C++ path (DRAFTWISE_ISA=portable) and whatever compiler this run was given (make test-toolchains)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from decoding.kernels import build as kernel_build
from decoding.kernels import integer_linear, row_ops
from decoding.models.checkpoint import load_model
from decoding.runners import exactness, runner_for
from decoding.runners.static import StaticRunner, not_exact_by_construction

kernels_here = pytest.mark.skipif(row_ops.problem() is not None, reason=f"attention kernel: {row_ops.problem()}")


@kernels_here
def test_the_static_forward_on_the_kernels_is_exact_by_construction_and_drafts(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    runner = runner_for(load_model(str(tiny_model_dir), "cpu", weights="int8"), 1 << 26)
    assert runner.model.attention_kernel and runner.exact_by_construction
    assert runner.exact_width == exactness.MAX_WIDTH and runner.exact_how == exactness.BY_CONSTRUCTION


@kernels_here
def test_attention_on_torchs_matmuls_is_not_exact_by_construction_and_does_not_draft_on_a_cpu(tiny_model_dir, tmp_path,
                                                                                           monkeypatch):
    """The issue's builds: int8 on its kernel (or _int_mm) with attention on torch.bmm passed the probe
    and drafted. It is exact as far as the probe looked, not by construction: no drafting on a CPU."""
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    loaded = load_model(str(tiny_model_dir), "cpu", weights="int8")
    loaded.model.attention_kernel = False  # what a decoder gets where row_ops.cpp does not build
    runner = runner_for(loaded, 1 << 26)
    assert runner.exactness["exact_width"] == exactness.MAX_WIDTH  # the probe saw no difference...
    assert not runner.exact_by_construction and runner.exact_width == 1 and not runner.verify_exact  # ...no drafting
    assert "attention runs on torch's batched matmuls" in runner.not_exact_why
    assert "not exact by construction" in runner.not_exact_why and "positions" in runner.not_exact_why
    assert getattr(runner, "exact_how", None) is None


def test_a_forward_off_the_kernels_drafts_only_where_probed_and_says_so(tiny_model_dir, tmp_path, monkeypatch):
    """Off a CPU (CUDA, MPS) a forward that is not exact by construction drafts as wide as the probe
    found exact, and says it is exact as probed, not by construction. (No GPU here: the device is only
    named, every forward runs on the CPU.)"""
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    loaded = load_model(str(tiny_model_dir), "cpu", weights="int8")
    runner = StaticRunner(loaded, 1 << 26)
    runner.exact_by_construction, runner.not_by_construction = False, "a stand-in reason"
    runner.device = torch.device("cuda")
    result = exactness.probe(runner)
    runner.exact_width = result["exact_width"]
    exactness.decide(runner, result)
    assert runner.exact_width == exactness.MAX_WIDTH and runner.verify_exact
    assert runner.exact_how.startswith(exactness.AS_PROBED) and "a stand-in reason" in runner.exact_how


def test_a_head_size_the_attention_kernel_lacks_decodes_plainly_and_says_so(tmp_path, monkeypatch):
    from decoding import EngineConfig
    from decoding.engine import Engine
    from tests.tiny_models import build_tiny_model

    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path / "home"))
    engine = Engine(EngineConfig(target=str(build_tiny_model(tmp_path / "heads-of-24", hidden=96)), weights="int8",
                                 max_tokens=4))
    engine.load()
    try:
        info = engine.info()
        assert info["kernel"].startswith("int8-") and "+rows" not in info["kernel"]  # what the decoder runs
        assert info["verify"]["lossless"] is False and "head size 24" in info["drafting_off"], info["drafting_off"]
    finally:
        engine.close()


def test_what_is_not_exact_by_construction_is_named(tiny_model_dir):
    from decoding.models.static_decoder import Dense, StaticDecoder
    from decoding.models.weights import Int4Linear, int4_groups

    decoder = load_model(str(tiny_model_dir), "cpu", weights="int8").model
    assert isinstance(decoder, StaticDecoder)
    if decoder.attention_kernel:
        assert not_exact_by_construction(decoder) is None
    decoder.attention_kernel = False
    assert "attention runs on torch's batched matmuls" in not_exact_by_construction(decoder)
    decoder.attention_kernel = True
    block = decoder.blocks[1]
    weight = torch.randn(block.down.out_features, block.down.in_features)
    block.down = Int4Linear(*int4_groups(weight, 32), 32, weight.shape[1], weight.shape[0], None)
    assert not_exact_by_construction(decoder).startswith("blocks.1.down runs on ATen's int4 kernel")
    block.down = Dense(weight, None, torch.float32)
    assert not_exact_by_construction(decoder) == "blocks.1.down runs on a float matmul"


@pytest.mark.skipif(not integer_linear.load(), reason=f"int8/int4 kernel: {integer_linear.problem()}")
def test_an_int4_layer_the_int4_kernel_cannot_take_runs_int8_on_the_kernel():
    """Not on ATen's int4 kernel or a float matmul: the forward stays exact by construction."""
    from decoding.models.static_decoder import _linear
    from decoding.models.weights import Int8Linear

    layer = _linear("int4", [torch.randn(48, 40)], [None])  # 40 inputs: not whole groups of 32
    assert isinstance(layer, Int8Linear) and layer.vnni
    assert isinstance(_linear("int4", [torch.randn(48, 64)], [None]), integer_linear.Q4Linear)


def test_the_probe_crosses_a_resize_of_the_kv_buffer_and_leaves_it_as_every_start_has_it(tiny_model_dir, tmp_path,
                                                                                       monkeypatch):
    """A decoder whose rotary tables come out otherwise once the buffer has grown (as tables computed
    at another length could): a one-token step before the resize and a verify row after it differ. The
    probe's last position is the buffer's last one, so it finds it; the buffer is then as it was."""
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    loaded = load_model(str(tiny_model_dir), "cpu", weights="int8")
    runner = StaticRunner(loaded, 1 << 26)
    model, initial = runner.model, runner.model.max_len
    assert exactness.probe(runner)["positions"][-1] == initial - 1
    assert model.max_len == initial  # a first start leaves the buffer later starts have

    resize = model.resize

    def resize_otherwise(max_len: int) -> None:
        resize(max_len)
        if max_len > initial:
            model.cos.mul_(1 + 2 ** -20)
    monkeypatch.setattr(model, "resize", resize_otherwise)
    result = exactness.probe(runner)
    assert result["exact_width"] == 1 and result["per_width"][2] > 0
    assert model.max_len == initial


def _engine_info(tiny_model_dir: Path, home: Path, weights: str = "int8", **env: str) -> dict:
    """Engine.info() of the tiny model in `weights`, loaded in a child process under `env`."""
    code = ("import json, sys; from decoding import EngineConfig; from decoding.engine import Engine; "
            f"e = Engine(EngineConfig(target={str(tiny_model_dir)!r}, weights={weights!r}, max_tokens=4)); e.load(); "
            "print(json.dumps(e.info())); e.close()")
    from decoding.home import paths

    home.mkdir(exist_ok=True)
    kept = paths.draftwise_home() / "extensions"  # kernel builds are shared (each in a folder of its own)
    kept.mkdir(parents=True, exist_ok=True)
    (home / "extensions").symlink_to(kept)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "DRAFTWISE_HOME": str(home), **env}, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_a_compiler_drafting_is_off_and_stats_say_why(tiny_model_dir, tmp_path):
    from decoding.models.weights import int_mm_exact

    no_compiler = dict(CXX="/bin/false", DRAFTWISE_REQUIRE_KERNELS="")
    if not int_mm_exact():  # (torch's AVX2 code: int8 is not offered without our kernel) transformers' fp32
        info = _engine_info(tiny_model_dir, tmp_path / "home", weights="fp32", **no_compiler)
        assert info["verify"]["lossless"] is False and info["verify"]["exact"] is None
        assert "fp32 weights" in info["drafting_off"] and "every request decodes plainly" in info["drafting_off"]
        return
    info = _engine_info(tiny_model_dir, tmp_path / "home", **no_compiler)
    assert info["kernel"].startswith("int8-intmm-") and "+rows" not in info["kernel"]
    assert info["verify"]["lossless"] is False and info["verify"]["exact"] is None
    off = info["drafting_off"]
    assert "not exact by construction" in off and "attention runs on torch's batched matmuls" in off, off
    assert "CXX=/bin/false does not compile C++" in off and "every request decodes plainly" in off, off


@pytest.mark.skipif(kernel_build.compiler_problem() is not None, reason=f"{kernel_build.compiler_problem()}")
def test_the_portable_path_is_exact_by_construction_and_drafts(tiny_model_dir, tmp_path):
    """DRAFTWISE_ISA=portable (what a CPU without AVX2 gets): no integer kernel of ours, so int8 runs on
    torch's _int_mm (exact where its sums do not saturate), and attention on row_ops.cpp's plain C++."""
    from decoding.models.weights import int_mm_exact

    if not int_mm_exact():
        pytest.skip("torch's _int_mm saturates on this CPU: int8 is not offered without our kernel")
    info = _engine_info(tiny_model_dir, tmp_path / "home", DRAFTWISE_ISA="portable")
    assert info["kernel"].startswith("int8-intmm+rows-portable-"), info["kernel"]
    assert info["verify"] == {"exact_width": exactness.MAX_WIDTH, "lossless": True, "exact": exactness.BY_CONSTRUCTION}
    assert not info["drafting_off"]


@kernels_here
def test_this_compilers_build_drafts_by_construction(tiny_model_dir, tmp_path):
    """The build this run's compiler ($CXX: make test-toolchains runs GCC 11 and clang) on the best path."""
    info = _engine_info(tiny_model_dir, tmp_path / "home")
    assert "+rows" in info["kernel"] and info["verify"]["exact"] == exactness.BY_CONSTRUCTION, info
    assert not info["drafting_off"]
