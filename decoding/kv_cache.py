"""KV caches kept across requests and keystrokes, reused by longest common token prefix.

A cache is owned by one request at a time. When a request starts, the stored cache sharing the
longest token prefix with its prompt is taken (or copied, if it belongs to another document) and
cropped to that prefix; only the rest of the prompt is prefilled. Total memory is bounded: the least
recently used caches are dropped first.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    # compare in blocks first: prompts are long and usually share most of their tokens
    step = 64
    while i + step <= n and a[i:i + step] == b[i:i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class CacheEntry:
    cache: Any  # transformers DynamicCache
    tokens: list[int]  # exactly the tokens whose keys/values the cache holds
    document: str
    used_at: float = field(default_factory=time.monotonic)


class KVStore:
    def __init__(self, bytes_per_token: int, budget_bytes: int, min_reuse: int = 16):
        self.bytes_per_token = max(1, bytes_per_token)
        self.budget_bytes = budget_bytes
        self.min_reuse = min_reuse  # below this a copied cache is not worth its memory traffic
        self.entries: list[CacheEntry] = []

    @property
    def tokens_held(self) -> int:
        return sum(len(e.tokens) for e in self.entries)

    def take(self, ids: list[int], document: str) -> tuple[Any, list[int]] | None:
        """The stored cache best matching ids, cropped to the match, as (cache, tokens)."""
        best, best_len = None, 0
        for e in self.entries:
            n = common_prefix_len(e.tokens, ids)
            if n > best_len or (n == best_len and best is not None and e.document == document):
                best, best_len = e, n
        if best is None or best_len == 0:
            return None
        if best.document == document:
            self.entries.remove(best)
            cache, tokens = best.cache, best.tokens
        elif best_len >= self.min_reuse:
            cache, tokens = copy.deepcopy(best.cache), list(best.tokens)
        else:
            return None
        keep = min(best_len, len(ids) - 1)  # the last prompt token is always fed: it yields the logits
        if len(tokens) > keep:
            cache.crop(keep - len(tokens))
            del tokens[keep:]
        return cache, tokens

    def put(self, cache: Any, tokens: list[int], document: str) -> None:
        self.entries = [e for e in self.entries if e.document != document]
        self.entries.append(CacheEntry(cache, tokens, document))
        self.entries.sort(key=lambda e: e.used_at)
        while self.entries and self.tokens_held * self.bytes_per_token > self.budget_bytes:
            self.entries.pop(0)

    def holds(self, cache: Any) -> bool:
        """Whether this very cache object is still stored (not evicted, not taken)."""
        return any(e.cache is cache for e in self.entries)

    def clear(self) -> None:
        self.entries.clear()
