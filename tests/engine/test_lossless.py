"""Greedy speculative decoding must equal plain greedy decoding, token for token, for every drafter."""
from __future__ import annotations

import random

import pytest
import torch

from decoding import CompletionRequest, EngineConfig
from decoding.engine import Engine
from tests.engine.healed import HealedPrompt, last_logits

WORDS = ["def", " foo", "(x)", ":", "\n    ", "return", " x", " +", " 1", "\n", "class", " A", "self", ".items",
         " =", " []", "for", " i", " in", " range", "(", ")", "{", "}", ";", "🙂", "漢字", "\t"]


def random_prompts(n: int, seed: int):
    """Random word salad; every third prefix ends in blanks, which the model writes itself (healing)."""
    rnd = random.Random(seed)
    for i in range(n):
        prefix = "".join(rnd.choice(WORDS) for _ in range(rnd.randrange(3, 80)))
        if i % 3 == 1:
            prefix = prefix.rstrip(" \t") + rnd.choice(["\n    ", " ", "\t", "\n        ", " \t "])
        suffix = "".join(rnd.choice(WORDS) for _ in range(rnd.randrange(0, 30)))
        yield prefix, suffix


def reference_greedy(engine: Engine, request: CompletionRequest, max_tokens: int) -> str:
    """Plain greedy decoding with no cache and no engine code: one whole-sequence forward per token."""
    model, prompt = engine.models.target.model, HealedPrompt(engine, request)
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(max_tokens):
            logits = prompt.limit(last_logits(model, prompt.ids + out), out)
            tok = int(logits.argmax())
            if tok in engine.models.end_ids:
                break
            out.append(tok)
    return prompt.text(out)


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tiny_draft_dir):
    # int8, the exact format (decoding/runners/exactness.py): reference_greedy recomputes the whole
    # sequence for every token, whose last row the static forward computes as a cached decode step does
    e = Engine(EngineConfig(target=str(tiny_model_dir), draft=str(tiny_draft_dir), drafter="model", max_tokens=48,
                            weights="int8", draft_weights="int8"))
    e.load()
    yield e
    e.close()


def test_every_drafter_matches_plain_greedy(engine):
    totals = {m: [0, 0] for m in ("model", "lookup", "suggestion", "auto")}
    partial_steps = healed = 0
    for i, (prefix, suffix) in enumerate(random_prompts(25, seed=7)):
        base = CompletionRequest(prefix=prefix, suffix=suffix, scope="full", max_tokens=48)
        expected = reference_greedy(engine, base, 48)
        healed += bool(HealedPrompt(engine, base).healed)
        # A hint as the server passes it (the rest of a shown suggestion) that is right for a while and
        # then wrong: the suggestion drafter's drafts are partly accepted.
        half = len(expected) // 2
        hint = expected[:half] + " # not what the model says" + expected[half:]
        for mode in ("none", "lookup", "model", "suggestion", "auto"):
            req = CompletionRequest(prefix=prefix, suffix=suffix, scope="full", max_tokens=48, drafter=mode,
                                    document=f"doc-{i}-{mode}", draft_hint=hint)
            result = engine.complete(req)
            assert result.text == expected, f"prompt {i}, drafter {mode}"
            s = result.stats
            if mode in totals:
                totals[mode][0] += s.drafted_tokens
                totals[mode][1] += s.accepted_tokens
            if mode == "model" and 0 < s.accepted_tokens < s.drafted_tokens:
                partial_steps += 1
    # The perturbed draft model is right for a while and then wrong: partial acceptance happened.
    drafted, accepted = totals["model"]
    assert drafted > 0 and 0 < accepted < drafted
    assert partial_steps >= 5
    assert healed >= 8  # prompts whose trailing blanks the model wrote under the healing constraint
    drafted, accepted = totals["suggestion"]
    assert drafted > 0 and 0 < accepted < drafted


def test_draft_model_acceptance_is_recorded_per_drafter(engine):
    result = engine.complete(CompletionRequest(prefix="def foo(x):\n    return", suffix="", drafter="model",
                                               scope="full", max_tokens=32, document="per-drafter"))
    s = result.stats
    assert s.drafted_by.get("model", 0) == s.drafted_tokens > 0
    assert s.accepted_by.get("model", 0) == s.accepted_tokens
    assert s.target_forwards <= s.generated_tokens + 1


def test_repository_lookup_drafts_are_verified_like_every_draft(engine):
    """lookup_texts (the repository beyond the prompt) hold the model's own continuation with a wrong
    turn in its middle: their drafts are accepted up to the turn and rejected after it, and the text
    is plain greedy decoding's."""
    partial = drafted_repo = 0
    for i, (prefix, suffix) in enumerate(random_prompts(12, seed=11)):
        base = CompletionRequest(prefix=prefix, suffix=suffix, scope="full", max_tokens=48)
        expected = reference_greedy(engine, base, 48)
        if len(expected) < 8:
            continue
        half = len(expected) // 2
        # The tail of the prefix leads into the stored text, so the repository's n-grams match there.
        stored = prefix[-40:] + expected[:half] + " wrong turn " + expected[half:]
        req = CompletionRequest(prefix=prefix, suffix=suffix, scope="full", max_tokens=48, drafter="lookup",
                                document=f"repo-{i}", lookup_texts=(stored, "unrelated text " * 20))
        result = engine.complete(req)
        assert result.text == expected, f"prompt {i}"
        repo_drafted = result.stats.drafted_by.get("repo", 0)
        repo_accepted = result.stats.accepted_by.get("repo", 0)
        drafted_repo += repo_drafted
        partial += 0 < repo_accepted < repo_drafted
    assert drafted_repo > 0 and partial >= 2
