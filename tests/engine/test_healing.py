"""Token healing of the prefix's last blank: the prompt leaves it out, the first token must write it,
the completion's text leaves it out again (decoding/healing.py)."""
from __future__ import annotations

import pytest

from decoding.healing import BlankHealing, without_healed
from decoding.models.tiny import build_tokenizer
from decoding.prompt import PromptBuilder
from tests.engine.test_prompt import decode, tokenizer_with


@pytest.fixture(scope="module")
def bpe():
    return build_tokenizer()  # a real byte-level BPE: blanks merge into runs and into ` word` tokens


@pytest.mark.parametrize("blank", [" ", "\t"])
def test_the_allowed_tokens_are_those_that_begin_with_exactly_the_blank(bpe, blank):
    healing = BlankHealing(bpe, vocab_size=len(bpe) + 5)  # logits may be wider than the vocabulary
    mask = healing.allowed(blank)
    texts = [bpe.decode([i], clean_up_tokenization_spaces=False) for i in range(len(bpe))]
    want = {i for i, t in enumerate(texts) if t.startswith(blank) and (t == blank or t[1] not in " \t")}
    assert want and set(mask.nonzero().flatten().tolist()) == want
    assert len(mask) == len(bpe) + 5 and not mask[len(bpe):].any()
    assert not any(mask[i] for i, t in enumerate(texts) if t.startswith(blank * 2))  # no second indentation


def test_the_prompt_ends_as_the_tokenizer_splits_blanks_before_code(bpe):
    """Left without its last blank, the prefix ends on the tokens the same blanks get in front of code,
    and the token after them, which starts with the last blank, is allowed."""
    from decoding.healing import Constraint

    for line in ["\n    return self.items", "\n        x = 1", "x = y + 1"]:
        cursor = len(line) - len(line.lstrip(" \n")) if line.startswith("\n") else line.index("y")
        prefix = line[:cursor]
        builder = PromptBuilder(bpe, budget=200)
        parts = builder.build(prefix, "", heal=True)
        natural = bpe.encode(line, add_special_tokens=False)
        head = bpe.encode(prefix[:-1], add_special_tokens=False)
        assert parts.ids[1:1 + len(head)] == head and parts.ids[1 + len(head)] == builder._special["<|fim_suffix|>"]
        assert natural[:len(head)] == head, line  # the prompt's blanks are the natural tokens
        follow = natural[len(head)]
        assert bpe.decode([follow]).startswith(parts.healed)
        constraint = Constraint(BlankHealing(bpe, len(bpe)), parts.healed)
        assert constraint.allowed([])[follow] and constraint.allowed([follow]) is None


def test_the_prompt_leaves_out_the_last_blank_of_the_prefix():
    tok = tokenizer_with(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])  # one token a character
    b = PromptBuilder(tok, budget=600)
    for prefix, blank in [("def f(x):\n    ", " "), ("    return ", " "), ("x = [\n  ", " "), ("x = 1", "")]:
        parts = b.build(prefix, "", heal=True)
        assert parts.healed == blank
        assert decode(tok, parts.ids).startswith("<|fim_prefix|>" + prefix[:len(prefix) - len(blank)] + "<|fim_suffix|>")
        assert b.build(prefix, "").healed == "" and decode(tok, b.build(prefix, "").ids).startswith(
            "<|fim_prefix|>" + prefix + "<|fim_suffix|>")  # remote engines send the prefix as it is


def test_the_completion_text_leaves_the_healed_blank_out():
    assert without_healed(" ", " x = 1") == "x = 1"
    assert without_healed("", "x") == "x"


def test_limited_rules_out_the_rest_at_any_table_width():
    import torch

    from decoding.healing import limited

    allowed = torch.tensor([False, True, False, True])
    logits = torch.arange(12.0).reshape(2, 6)  # a wider table (a draft model's, padded): extra columns out
    out = limited(logits, allowed)
    assert out[:, [1, 3]].tolist() == logits[:, [1, 3]].tolist()
    assert torch.isinf(out[:, [0, 2, 4, 5]]).all()
    assert limited(logits[:, :3], allowed)[0].tolist() == [float("-inf"), 1.0, float("-inf")]
