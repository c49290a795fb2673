"""Reused and cropped KV caches must give the same logits as a fresh prefill."""
from __future__ import annotations

import pytest
import torch

from decoding import CompletionRequest, EngineConfig
from decoding.engine import Engine
from decoding.models.checkpoint import load_model
from decoding.runners.hf import ModelRunner


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(str(tiny_model_dir))


def last_logits_fresh(loaded, ids):
    runner = ModelRunner(loaded, 1 << 26)
    runner.start(ids, "fresh")
    runner.sync(ids)
    return runner.forward(ids[-1:])[-1]


def test_reuse_after_edit_equals_fresh_prefill(loaded):
    runner = ModelRunner(loaded, 1 << 26)
    a = list(range(10, 90))
    b = a[:50] + list(range(200, 230))  # an edit at position 50
    runner.start(a, "doc")
    runner.sync(a)
    runner.forward(a[-1:] + [5, 6, 7])  # as if three drafted tokens were verified
    runner.crop_to(len(a) + 1)  # one accepted, two rejected
    runner.finish()
    reused = runner.start(b, "doc")
    assert reused == 50
    fed = runner.sync(b)
    assert fed == len(b) - 1 - 50
    got = runner.forward(b[-1:])[-1]
    torch.testing.assert_close(got, last_logits_fresh(loaded, b), rtol=1e-4, atol=1e-4)


def test_crop_then_continue_equals_fresh(loaded):
    runner = ModelRunner(loaded, 1 << 26)
    ids = list(range(20, 70))
    runner.start(ids, "doc")
    runner.sync(ids)
    runner.forward(ids[-1:] + [11, 12, 13, 14])
    runner.crop_to(len(ids))  # reject the whole draft
    got = runner.forward([11])[-1]
    torch.testing.assert_close(got, last_logits_fresh(loaded, ids + [11]), rtol=1e-4, atol=1e-4)


def test_other_documents_get_a_copy_and_the_store_stays_bounded(loaded):
    runner = ModelRunner(loaded, 1 << 26)
    shared = list(range(30, 100))
    runner.start(shared + [1], "a")
    runner.sync(shared + [1])
    runner.finish()
    assert runner.start(shared + [2], "b") == len(shared)  # copied from "a"
    runner.sync(shared + [2])
    runner.finish()
    assert {e.document for e in runner.store.entries} == {"a", "b"}
    tiny_budget = ModelRunner(loaded, runner.store.bytes_per_token * 100)
    for doc in ("x", "y", "z"):
        ids = [hash(doc) % 50 + 10] + shared
        tiny_budget.start(ids, doc)
        tiny_budget.sync(ids)
        tiny_budget.finish()
    assert tiny_budget.store.tokens_held <= 100
    assert [e.document for e in tiny_budget.store.entries] == ["z"]


def test_engine_reuses_prompt_across_keystrokes(tiny_model_dir):
    engine = Engine(EngineConfig(target=str(tiny_model_dir), max_tokens=8))
    engine.load()
    try:
        prefix = "".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(20))
        first = engine.complete(CompletionRequest(prefix=prefix, suffix="\n", document="k"))
        second = engine.complete(CompletionRequest(prefix=prefix + "de", suffix="\n", document="k"))
        assert first.stats.reused_prompt_tokens == 0
        # Everything up to the edit is reused; only the typed text and the short suffix are prefilled.
        assert second.stats.prompt_tokens - second.stats.reused_prompt_tokens <= 8
    finally:
        engine.close()
