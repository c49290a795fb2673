"""Injected faults (out of memory while loading or generating, a broken draft) leave a working engine."""
from __future__ import annotations

import pytest

from decoding import CompletionRequest, EngineConfig, faults
from decoding.engine import Engine
from decoding.errors import DraftwiseError, ModelLoadError


@pytest.fixture(autouse=True)
def fresh_faults(monkeypatch):
    yield monkeypatch
    faults.reset()


def test_out_of_memory_while_loading_fails_cleanly(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_FAULTS", "target_load_oom")
    faults.reset()
    e = Engine(EngineConfig(target=str(tiny_model_dir)))
    with pytest.raises(ModelLoadError, match="out of memory"):
        e.load()
    assert e.state == "failed" and "out of memory" in e.error
    e.close()


def test_draft_failure_serves_with_the_target_alone(tiny_model_dir, tiny_draft_dir, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_FAULTS", "draft_load_error")
    faults.reset()
    e = Engine(EngineConfig(target=str(tiny_model_dir), draft=str(tiny_draft_dir), drafter="model",
                            weights="int8", draft_weights="int8"))  # exact on every CPU: drafting stays on
    e.load()
    assert e.state == "ready" and e.models.draft is None and "failed to load" in e.info()["draft_note"]
    assert e.complete(CompletionRequest(prefix="def f(x):\n    return", max_tokens=4, scope="full")).stats.generated_tokens == 4
    e.close()


def test_out_of_memory_while_generating_then_recovery(tiny_model_dir, monkeypatch):
    e = Engine(EngineConfig(target=str(tiny_model_dir)))
    e.load()
    req = CompletionRequest(prefix="x = 1\n" * 20, max_tokens=6, scope="full", document="d")
    good = e.complete(req)
    monkeypatch.setenv("DRAFTWISE_FAULTS", "generate_oom:1")
    faults.reset()
    with pytest.raises(DraftwiseError, match="out of memory"):
        e.complete(req)
    again = e.complete(req)  # the engine survived; caches were dropped, so this one starts cold
    assert again.text == good.text and again.stats.reused_prompt_tokens == 0
    e.close()
