"""Alternatives on request: the greedy text is untouched, the others are distinct greedy continuations
of the next-best first tokens, and they reuse the prompt's cache."""
from __future__ import annotations

import pytest
import torch

from decoding import CompletionRequest, EngineConfig
from decoding.engine import Engine
from tests.engine.healed import HealedPrompt, last_logits
from tests.engine.test_lossless import random_prompts, reference_greedy


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    # int8 pinned: the references below run uncached whole-sequence forwards, whose last rows the static
    # forward computes exactly as a cached decode step (decoding/models/static_decoder.py)
    e = Engine(EngineConfig(target=str(tiny_model_dir), drafter="auto", max_tokens=16, weights="int8"))
    e.load()
    yield e
    e.close()


def greedy_from(engine: Engine, prompt: HealedPrompt, first: int, max_tokens: int) -> str:
    """Plain greedy decoding forced to start with `first`: one full forward per token, no cache."""
    out = [first]
    with torch.inference_mode():
        while len(out) < max_tokens:
            logits = last_logits(engine.models.target.model, prompt.ids + out)
            tok = int(prompt.limit(logits, out).argmax())
            if tok in engine.models.end_ids:
                break
            out.append(tok)
    return prompt.text(out)


def test_greedy_text_is_the_same_with_alternatives(engine):
    for i, (prefix, suffix) in enumerate(random_prompts(6, seed=3)):
        plain = CompletionRequest(prefix=prefix, suffix=suffix, scope="full", max_tokens=16)
        with_alternatives = CompletionRequest(prefix=prefix, suffix=suffix, scope="full", max_tokens=16,
                                              alternatives=2, document=f"alt-{i}")
        result = engine.complete(with_alternatives)
        assert result.text == reference_greedy(engine, plain, 16), f"prompt {i}"
        assert result.text == engine.complete(plain).text


def test_alternatives_are_distinct_greedy_continuations_of_next_best_first_tokens(engine):
    prefix, suffix = "def fibonacci(n):\n    if n < 2:\n        return n\n    return ", ""
    request = CompletionRequest(prefix=prefix, suffix=suffix, scope="full", max_tokens=10, alternatives=2,
                                document="alt-ranked")
    result = engine.complete(request)
    assert len(result.alternatives) == 2
    texts = [result.text, *result.alternatives]
    assert len({t.strip() for t in texts}) == 3, texts
    prompt = HealedPrompt(engine, request)
    assert prompt.healed == " ", "the prompt ends with a space: the first tokens are limited to those that write it"
    with torch.inference_mode():
        first = prompt.limit(last_logits(engine.models.target.model, prompt.ids), [])
    ranked = first.topk(40).indices.tolist()
    expected = []
    for token in ranked[1:]:
        if token in engine.models.end_ids:
            continue
        text = greedy_from(engine, prompt, token, 10)
        if text.strip() and text.strip() not in {t.strip() for t in [result.text, *expected]}:
            expected.append(text)
        if len(expected) == 2:
            break
    assert result.alternatives == expected


def test_alternatives_read_the_prompt_once(engine):
    request = CompletionRequest(prefix="class Stack:\n    def push(self, item):\n        ", scope="full",
                                max_tokens=8, alternatives=2, document="alt-cache")
    engine.complete(request)  # warm: the prompt's cache is stored
    runner = engine.models.target_runner
    fed: list[int] = []
    original = runner.forward

    def counting(ids, logits_to_keep=None):
        fed.append(len(ids))
        return original(ids, logits_to_keep)

    runner.forward = counting
    try:
        result = engine.complete(request)
    finally:
        runner.forward = original
    assert len(result.alternatives) == 2
    prompt_len = len(engine.build_prompt(request))
    assert max(fed) < prompt_len // 2, f"a forward of {max(fed)} tokens re-read the {prompt_len}-token prompt"


def test_no_alternatives_unless_asked(engine):
    result = engine.complete(CompletionRequest(prefix="import os\n", scope="full", max_tokens=8))
    assert result.alternatives == []
    assert "alternatives" not in result.to_dict()


def test_after_a_partial_word_every_alternative_starts_with_a_token_that_writes_it(engine, monkeypatch):
    """Where fewer tokens may write the healed word than alternatives are asked for, only those are
    continued (the rest of the ranking is ruled out, at -inf), so no alternative breaks the word."""
    from decoding import alternatives

    firsts = []
    real = alternatives._continue
    monkeypatch.setattr(alternatives, "_continue", lambda models, plan, token, cancel: (
        firsts.append((token, plan.healing)), real(models, plan, token, cancel))[1])
    for i, prefix in enumerate(["local function gre", "    return self.ite", "import os, sys, js"]):
        request = CompletionRequest(prefix=prefix, scope="full", max_tokens=8, alternatives=3, document=f"alt-word-{i}")
        prompt = HealedPrompt(engine, request)
        assert prompt.healed.strip(), prefix
        firsts.clear()
        engine.complete(request)
        allowed = prompt.limit(torch.zeros(engine.models.target.model.config.vocab_size), [])
        assert all(torch.isfinite(allowed[token]) for token, _ in firsts), (prefix, firsts)
