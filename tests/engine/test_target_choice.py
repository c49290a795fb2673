"""`target: auto` (decoding/setup/target_choice.py): the 1.5B where it is pulled, fits in memory and runs
fast enough on this machine, else the 0.5B; the choice and its reason travel with the loaded engine."""
from __future__ import annotations

import pytest

from decoding import EngineConfig
from decoding.setup import target_choice
from decoding.setup.target_choice import LARGER, SMALLER, TargetChoice, choose_target


@pytest.fixture
def pulled(monkeypatch):
    """Which presets count as pulled."""
    present: set[str] = {LARGER, SMALLER}
    from decoding.models import pack

    monkeypatch.setattr(pack, "is_pulled", lambda preset, root=None: preset.name in present)
    return present


def test_a_named_target_is_loaded_as_named():
    assert choose_target("qwen2.5-coder-0.5b") == TargetChoice("qwen2.5-coder-0.5b", "asked for")
    assert choose_target("/models/mine").spec == "/models/mine"


def test_auto_takes_the_larger_model_only_where_it_runs_fast_enough(pulled, monkeypatch):
    monkeypatch.setattr(target_choice, "_free_gib", lambda: 16.0)
    monkeypatch.setattr(target_choice, "measured_speed", lambda: {"read_tok_s": 900.0, "step_ms": 40.0})
    fast = choose_target("auto", "cpu")
    assert fast.spec == LARGER and "reads 900 prompt tokens/s" in fast.reason
    monkeypatch.setattr(target_choice, "measured_speed", lambda: {"read_tok_s": 150.0, "step_ms": 40.0})
    slow = choose_target("auto", "cpu")
    assert slow.spec == SMALLER and slow.reason.endswith("too slow") and slow.measured["read_tok_s"] == 150.0
    monkeypatch.setattr(target_choice, "measured_speed", lambda: {"read_tok_s": 900.0, "step_ms": 200.0})
    assert choose_target("auto", "cpu").spec == SMALLER  # decode too slow for typing along
    monkeypatch.setattr(target_choice, "measured_speed", lambda: None)
    assert "kernels do not run here" in choose_target("auto", "cpu").reason


def test_a_failed_measurement_takes_the_smaller_model_and_says_why(pulled, monkeypatch):
    def fails():
        raise RuntimeError("out of memory")

    monkeypatch.setattr(target_choice, "_free_gib", lambda: 16.0)
    monkeypatch.setattr(target_choice, "measured_speed", fails)
    choice = choose_target("auto", "cpu")
    assert choice.spec == SMALLER and "failed: out of memory" in choice.reason


def test_auto_takes_the_smaller_model_where_the_larger_is_not_pulled_or_does_not_fit(pulled, monkeypatch):
    monkeypatch.setattr(target_choice, "measured_speed", lambda: {"read_tok_s": 900.0, "step_ms": 40.0})
    monkeypatch.setattr(target_choice, "_free_gib", lambda: 1.2)
    assert choose_target("auto", "cpu") == TargetChoice(SMALLER, f"1.2 GiB of memory free: {LARGER} needs about 1.5 GiB")
    monkeypatch.setattr(target_choice, "_free_gib", lambda: 16.0)
    pulled.discard(LARGER)
    assert choose_target("auto", "cpu").spec == SMALLER and "is not pulled" in choose_target("auto", "cpu").reason


def test_the_speed_is_measured_once_a_machine_and_kept(tmp_path, monkeypatch):
    from decoding.kernels import integer_linear

    if not integer_linear.load():
        pytest.skip("the integer kernels do not run here (no speed to measure)")
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    calls = []
    real = target_choice._measure
    monkeypatch.setattr(target_choice, "_measure", lambda: calls.append(1) or real(rows=32, repeats=1))
    first = target_choice.measured_speed()
    assert first["read_tok_s"] > 0 and first["step_ms"] > 0 and calls == [1]
    assert target_choice.measured_speed() == first and calls == [1]  # read back, not measured again
    assert (tmp_path / target_choice.RECORD).is_file()
    monkeypatch.setattr(target_choice, "LAYERS", target_choice.LAYERS + 1)  # other shapes: measured again
    target_choice.measured_speed()
    assert calls == [1, 1]


def test_the_engine_reports_which_model_auto_chose_and_why(tiny_model_dir, monkeypatch):
    from decoding.engine import Engine

    choice = TargetChoice(str(tiny_model_dir), "a stand-in for the reason: the presets are too slow to load here")
    monkeypatch.setattr(target_choice, "choose_target", lambda target, device="auto": choice)
    engine = Engine(EngineConfig(target="auto", weights="fp32"))
    engine.load()
    try:
        info = engine.info()
        assert info["target"] == str(tiny_model_dir) and info["target_choice"] == choice.reason
        assert engine.config.target == "auto"  # what was asked stays as asked
    finally:
        engine.close()
