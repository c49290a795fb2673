"""The blank at the cursor, left out of the prompt and written by the model (token healing).

A prompt that ends in blanks ends on a token the model has hardly ever seen before code: its
tokenizer writes an indented `        self.x` as `       ` + ` self` (the last blank goes with the
word), so a prefix that stops after the indentation ends on the token `        `, which in training
was followed by more blanks or a line end. At a new line's indentation the model then indented once
more: on 81 benchmark cursors at a line start (Qwen2.5-Coder-0.5B, Q4, no lines after the cursor in
the prompt), 51 first lines began with extra blanks and 2 were exactly right.

So the prompt leaves out the prefix's last blank (decoding/prompt.py): the blanks before it
tokenize as they do in front of code, and the model's first token must begin with the one left out
(` self`, ` return`, or more blanks where it means to indent further). Constraining the whole run of
blanks instead lets greedy decoding start on a shorter run it then cannot finish naturally. The
completion's text leaves the blank out again, since the document has it already. Plain and
speculative decoding apply the same constraint to the same position, so they still agree token for
token.
"""
from __future__ import annotations

import torch

BLANKS = " \t"
# Raw vocabulary strings that can decode to text starting with a blank: the blank itself, byte-level
# BPE's markers for a space and a tab (GPT-2 style: Qwen, StarCoder, DeepSeek), SentencePiece's space.
_BLANK_MARKERS = frozenset(" \tĠĉ▁")


def is_blank(text: str) -> bool:
    return bool(text) and not text.strip(BLANKS)


def _decoded_alone(tokenizer, raw: list[str], ids: list[int]) -> list[str]:
    """Each token's text on its own. The fast tokenizer's own decoder takes a tenth of batch_decode's
    time (0.04 s against 0.36 s for Qwen's 54k candidates: a start waits on it); where its texts
    differ from batch_decode's on a sample, or it has none, batch_decode it is."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    slow = lambda chosen: tokenizer.batch_decode([[i] for i in chosen], clean_up_tokenization_spaces=False)  # noqa: E731
    if decoder is not None:
        sample = ids[:: max(1, len(ids) // 200)]
        if [decoder.decode([raw[i]]) for i in sample] == slow(sample):
            return [decoder.decode([raw[i]]) for i in ids]
    return slow(ids)


class BlankHealing:
    """For one tokenizer: the tokens that may write a healed blank."""

    def __init__(self, tokenizer, vocab_size: int):
        self.vocab_size = vocab_size  # the model's logits width (may exceed the tokenizer's)
        raw = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        candidates = [i for i, token in enumerate(raw) if token and token[0] in _BLANK_MARKERS]
        texts = _decoded_alone(tokenizer, raw, candidates)
        self._by_lead: dict[str, list[int]] = {}  # the blanks a token starts with -> ids
        for i, text in zip(candidates, texts):
            lead = text[:len(text) - len(text.lstrip(BLANKS))]
            if lead and i < vocab_size:
                self._by_lead.setdefault(lead, []).append(i)
        self._masks: dict[str, torch.Tensor] = {}

    def allowed(self, blanks: str) -> torch.Tensor:
        """[vocab] bool: the tokens that begin with exactly `blanks` (` return`, ` (`, or the blank
        alone), as the tokenizer splits text after a run of blanks. Not a longer run: after the
        prompt's blanks the tokenizer never puts more blanks in a token of their own before code, so
        a model that picks one is off its training data, and indented twice."""
        mask = self._masks.get(blanks)
        if mask is None:
            mask = torch.zeros(self.vocab_size, dtype=torch.bool)
            mask[self._by_lead.get(blanks, [])] = True
            self._masks[blanks] = mask
        return mask


def limited(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """[..., V] logits with the tokens `allowed` rules out at -inf (a draft model's table may be
    padded to another width than the target's: columns past the mask are ruled out)."""
    width = logits.shape[-1]
    mask = allowed[:width] if len(allowed) >= width else torch.cat([allowed, allowed.new_zeros(width - len(allowed))])
    return logits.masked_fill(~mask.to(logits.device), float("-inf"))


def without_healed(healed: str, text: str) -> str:
    """The completion's text: the generated text minus the healed blank it begins with."""
    return text[len(healed):] if text.startswith(healed) else text


class Constraint:
    """One request's healing: the first token must begin with exactly the healed blank."""

    def __init__(self, healing: BlankHealing, healed: str):
        self.healing, self.healed = healing, healed

    def allowed(self, generated: list[int]) -> torch.Tensor | None:
        """[vocab] bool for the next token after `generated` (the tokens since the prompt)."""
        return None if generated else self.healing.allowed(self.healed)
