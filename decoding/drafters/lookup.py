"""Lookup drafting: code repeats itself, so continue the longest recent n-gram match.

Sources are the whole prompt (other files, the prefix, the text after the cursor) and the tokens
generated so far. It costs no model time; the cost model decides whether a match is worth verifying.
"""
from __future__ import annotations

from decoding.drafters.base import Draft, DraftContext, Drafter, Offer

NGRAM_SIZES = (8, 6, 4, 3, 2, 1)  # longest first: a longer match predicts better


class LookupDrafter(Drafter):
    name = "lookup"

    def __init__(self, sizes: tuple[int, ...] = NGRAM_SIZES):
        self.sizes = sizes
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> where its latest continuation starts
        self._indexed = 0
        self._seq: list[int] = []

    def begin(self, ctx: DraftContext) -> None:
        self._index.clear()
        self._indexed = 0
        self._seq = []

    def _update(self, seq: list[int]) -> None:
        # seq only grows during a request; index positions up to len(seq) - 1 so that the current
        # end never matches itself (its continuation is what we want to predict).
        self._seq = seq
        index = self._index
        for end in range(max(self._indexed, 1), len(seq)):
            for n in self.sizes:
                if end >= n:
                    index[tuple(seq[end - n:end])] = end
        self._indexed = max(self._indexed, len(seq))

    def match(self, seq: list[int]) -> tuple[int, int]:
        """(n, start): the longest n-gram ending seq that occurred before, and where its continuation starts."""
        self._update(seq)
        for n in self.sizes:
            if len(seq) >= n:
                start = self._index.get(tuple(seq[-n:]))
                if start is not None and start < len(seq):
                    return n, start
        return 0, -1

    def offer(self, seq: list[int], room: int) -> Offer | None:
        n, start = self.match(seq)
        if not n or room <= 0:
            return None
        return Offer(min(len(seq) - start, room), self._key(n))

    def propose(self, seq: list[int], k: int) -> Draft | None:
        n, start = self.match(seq)
        if not n or k <= 0:
            return None
        tokens = seq[start:start + k]
        return Draft(tokens, self.name, key=self._key(n)) if tokens else None

    @staticmethod
    def _key(n: int) -> str:
        return f"lookup:n{min(n, 4)}"  # longer matches are no more reliable than 4-grams
