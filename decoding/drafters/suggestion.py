"""The suggestion drafter: the user is typing what we suggested a moment ago.

The caller (the LSP server remembers what it showed) passes the rest of that suggestion as the
request's `draft_hint`; it is proposed as a draft. The target verifies it like any other draft, so a
stale or wrong hint costs one forward and never changes the output.
"""
from __future__ import annotations

from decoding.drafters.base import Draft, DraftContext, Drafter, Offer
from decoding.agreement import remains


class SuggestionDrafter(Drafter):
    name = "suggestion"

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self._draft: list[int] = []
        self._prompt_len = 0

    def begin(self, ctx: DraftContext) -> None:
        hint = ctx.draft_hint
        self._draft = self.tok.encode(hint, add_special_tokens=False) if hint else []
        self._prompt_len = len(ctx.prompt_ids)

    def _remaining(self, seq: list[int]) -> list[int]:
        # What the target generated is "typed" along the hint; where it went another way, the hint
        # no longer applies.
        return remains(self._draft, seq[self._prompt_len:]) or []

    def offer(self, seq: list[int], room: int) -> Offer | None:
        n = min(len(self._remaining(seq)), room) if self._draft else 0
        return Offer(n, "suggestion") if n > 0 else None

    def propose(self, seq: list[int], k: int) -> Draft | None:
        rest = self._remaining(seq)[:k] if self._draft else []
        return Draft(rest, self.name, key="suggestion") if rest else None

    def end(self, failed: bool = False) -> None:
        self._draft = []
