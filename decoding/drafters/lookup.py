"""Lookup drafting: code repeats itself, so continue the longest recent n-gram match.

Sources are the whole prompt (other files, the prefix, the text after the cursor) and the tokens
generated so far, then the repository beyond the prompt (CompletionRequest.lookup_texts: the files
most like the code at the cursor), as REST drafts from a datastore. It costs no model time; the cost
model prices prompt and repository matches apart (their keys) and decides whether one is worth
verifying.
"""
from __future__ import annotations

from typing import Callable, Sequence

from decoding.drafters.base import Draft, DraftContext, Drafter, Offer

NGRAM_SIZES = (8, 6, 4, 3, 2, 1)  # longest first: a longer match predicts better
# The repository is large and not about this request: a short match there predicts little.
REPO_NGRAM_SIZES = (8, 6, 4, 3)
REPO_TABLES_KEPT = 2  # the selection changes rarely while the user types: rebuild only then


class RepositoryTable:
    """n-gram -> where its first continuation is, over the tokens of several texts."""

    def __init__(self, docs: list[list[int]], sizes: tuple[int, ...] = REPO_NGRAM_SIZES):
        self.docs, self.sizes = docs, sizes
        self.table: dict[tuple[int, ...], tuple[int, int]] = {}
        for d, ids in enumerate(docs):
            for end in range(1, len(ids)):
                for n in sizes:
                    if end >= n:
                        self.table.setdefault(tuple(ids[end - n:end]), (d, end))

    def match(self, seq: list[int]) -> tuple[int, list[int]]:
        """(n, continuation) of the longest n-gram ending seq found in the texts; (0, []) if none."""
        for n in self.sizes:
            if len(seq) >= n:
                hit = self.table.get(tuple(seq[-n:]))
                if hit is not None:
                    d, end = hit
                    return n, self.docs[d][end:end + 64]
        return 0, []


class LookupDrafter(Drafter):
    name = "lookup"

    def __init__(self, sizes: tuple[int, ...] = NGRAM_SIZES, encode: Callable[[str], list[int]] | None = None):
        self.sizes = sizes
        self.encode = encode  # the target's tokenizer: without it, no repository lookup
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> where its latest continuation starts
        self._indexed = 0
        self._seq: list[int] = []
        self._repo: RepositoryTable | None = None
        self._repo_tables: dict[int, RepositoryTable] = {}

    def begin(self, ctx: DraftContext) -> None:
        self._index.clear()
        self._indexed = 0
        self._seq = []
        self._repo = self._repository(ctx.lookup_texts)

    def _repository(self, texts: Sequence[str]) -> RepositoryTable | None:
        if not texts or self.encode is None:
            return None
        key = hash(tuple(texts))
        table = self._repo_tables.get(key)
        if table is None:
            table = RepositoryTable([self.encode(t) for t in texts])
            while len(self._repo_tables) >= REPO_TABLES_KEPT:
                self._repo_tables.pop(next(iter(self._repo_tables)))
            self._repo_tables[key] = table
        return table

    def clear(self) -> None:
        self._repo_tables.clear()

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

    def _best(self, seq: list[int]) -> tuple[list[int], str, str]:
        """(continuation, source, key): the prompt's match unless the repository's is longer."""
        n, start = self.match(seq)
        if self._repo is not None and n < REPO_NGRAM_SIZES[0]:
            repo_n, continuation = self._repo.match(seq)
            if repo_n > n:
                return continuation, "repo", f"repo:n{min(repo_n, 6)}"
        if not n:
            return [], self.name, ""
        return seq[start:start + 64], self.name, self._key(n)

    def offer(self, seq: list[int], room: int) -> Offer | None:
        continuation, _, key = self._best(seq)
        if not continuation or room <= 0:
            return None
        return Offer(min(len(continuation), room), key)

    def propose(self, seq: list[int], k: int) -> Draft | None:
        continuation, source, key = self._best(seq)
        tokens = continuation[:k] if k > 0 else []
        return Draft(tokens, source, key=key) if tokens else None

    @staticmethod
    def _key(n: int) -> str:
        return f"lookup:n{min(n, 4)}"  # longer matches are no more reliable than 4-grams
