"""The real Qwen2.5-Coder-0.5B: every drafter gives the same text on standard-library FIM cases."""
from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from decoding import CompletionRequest, EngineConfig
from decoding.engine import Engine

pytestmark = pytest.mark.real_model
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def fim_cases():
    """Cursor at the start of a removed statement inside real standard-library functions."""
    for name, statement in [("textwrap.py", "text = text.expandtabs(self.tabsize)"),
                            ("json/encoder.py", "chunks = self.iterencode(o, _one_shot=True)"),
                            ("shlex.py", "self.lineno = 1")]:
        text = (STDLIB / name).read_text()
        at = text.index(statement)
        yield name, text[:at], text[at + len(statement):]


@pytest.fixture(scope="module", params=["int8", "int4"])
def engine(real_model, request):
    # The 0.5B drafting for itself, in the same weights: every draft token must be accepted, a valid
    # all-accept check, and a check that a k-token verify forward computes what the draft's one-token
    # steps computed, bit for bit, on the real model (the exact formats: fp32 decodes plainly here).
    e = Engine(EngineConfig(target=real_model, draft=real_model, drafter="model", max_tokens=20, context_tokens=768,
                            weights=request.param, draft_weights=request.param))
    e.load()
    yield e
    e.close()


@pytest.mark.parametrize("case", list(fim_cases()), ids=lambda c: c[0])
def test_drafters_agree_with_plain_greedy(engine, case):
    name, prefix, suffix = case
    texts, stats = {}, {}
    for mode in ("none", "lookup", "model", "auto"):
        r = engine.complete(CompletionRequest(prefix=prefix, suffix=suffix, path=name, document=f"{name}:{mode}",
                                              drafter=mode, scope="line"))
        texts[mode], stats[mode] = r.text, r.stats
    assert texts["none"].strip()
    assert texts["lookup"] == texts["model"] == texts["auto"] == texts["none"]
    m = stats["model"]
    assert m.accepted_tokens == m.drafted_tokens > 0  # the same model drafting: everything accepted
    assert m.target_forwards < m.generated_tokens


def test_typing_along_a_suggestion_is_verified_in_few_forwards(engine):
    name, prefix, suffix = next(fim_cases())
    doc = "typing-along"
    first = engine.complete(CompletionRequest(prefix=prefix, suffix=suffix, document=doc, drafter="auto", scope="line"))
    assert len(first.text) > 6
    typed = first.text[:4]
    # the rest of the shown suggestion, as the server passes it while the user types along
    warm = engine.complete(CompletionRequest(prefix=prefix + typed, suffix=suffix, document=doc, drafter="auto",
                                             scope="line", draft_hint=first.text[4:]))
    assert warm.stats.accepted_by.get("suggestion", 0) > 0
    # Only the edit and the (budget-capped) suffix section are prefilled again.
    assert warm.stats.prompt_tokens - warm.stats.reused_prompt_tokens <= engine.models.prompts.suffix_budget + 16
    plain = engine.complete(CompletionRequest(prefix=prefix + typed, suffix=suffix, document="cold", drafter="none",
                                              scope="line"))
    assert warm.text == plain.text
    assert warm.stats.target_forwards < plain.stats.target_forwards
