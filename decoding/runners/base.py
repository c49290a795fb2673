"""What every runner shares: the prompt-prefix sync, and one live cache with a store of saved ones.

A runner is a model plus the KV cache of the sequence it is working on. Invariant between calls:
`runner.tokens` lists exactly the tokens whose keys/values are in the live cache.
"""
from __future__ import annotations

import os
import time
from typing import Any

import torch

from decoding.api import CancelToken, Cancelled
from decoding.kv_cache import KVStore, common_prefix_len

PREFILL_CHUNK = 512  # tokens per prefill forward: bounds the wait for a cancel during long prefills;
# each chunk re-reads all weights, so smaller chunks make every cold prompt slower on a CPU


def synthetic_tokens(vocab_size: int, n: int) -> list[int]:
    """n ordinary token ids to time or probe forwards with (their values do not change the cost)."""
    return [(i * 7919) % min(vocab_size - 20, 1000) + 10 for i in range(n)]


class Runner:
    """What every runner keeps: `tokens`, `store`, start/finish/discard, `crop_to`, `forward`; and
    what they all do the same way on top of those (the prompt-prefix sync)."""

    # Prompt tokens a request leaves for its first verify forward (sync's `unread`). Where a verify
    # row is not exactly a decode step, plain and drafted decoding must read the prompt alike: all of
    # it but the last token first.
    prompt_tail = 1
    # The widest forward whose every row equals a one-token step's, bit for bit (measured:
    # decoding/runners/exactness.py); drafts are at most this minus one token long. 1: none is.
    exact_width = 1
    verify_difference = 0.0  # the largest logit difference the exactness probe saw beyond exact_width
    # Whether a verify row equals a decode step by how the forward is written (the static forward),
    # not only where the probe looked. On a CPU, drafting needs it: transformers' forward in bf16 passed
    # the probe up to 7 rows on the tiny model under torch's AVX2 code, then changed a text.
    exact_by_construction = False
    not_exact_why = ""  # set where drafting is off although the probe found rows exact

    @property
    def verify_exact(self) -> bool:
        """Drafting cannot change the text: verify forwards of two or more rows are exact."""
        return self.exact_width >= 2

    def sync(self, seq: list[int], cancel: CancelToken | None = None, unread: int = 1) -> int:
        """Make the cache hold seq but its last token (crop where it diverges, feed what is missing),
        or, with `unread` > 1, leave up to that many of the missing tokens at its end unread for the
        caller's next forward. Returns tokens fed."""
        keep = min(common_prefix_len(self.tokens, seq), len(seq) - 1)
        self.crop_to(keep)
        missing = seq[keep:len(seq) - max(1, min(unread, len(seq) - keep))]
        for i in range(0, len(missing), self.prefill_chunk):
            if cancel is not None and cancel.cancelled:
                raise Cancelled()
            self._read_prompt(missing[i:i + self.prefill_chunk])
        return len(missing)

    def _read_prompt(self, ids: list[int]) -> None:
        """Feed prompt tokens whose logits nobody reads (sync's chunks)."""
        self.forward(ids, logits_to_keep=1)

    prefill_chunk = PREFILL_CHUNK

    def _counted(self) -> None:
        """Bookkeeping after every forward: counts, the test-only delay, forwards after a cancel."""
        self.forwards += 1
        if self.test_delay_s:
            time.sleep(self.test_delay_s)
        if self.cancel is not None and self.cancel.cancelled:
            self.forwards_after_cancel += 1  # what a cancel costs: the forward already in flight

    def _init_bookkeeping(self, role: str, loaded) -> None:
        self.role, self.loaded = role, loaded
        self.device = loaded.device
        self.tokens: list[int] = []
        self.document = ""
        self.forwards = 0  # lifetime count, read by tests and stats
        self.cancel: CancelToken | None = None  # the running request's, set by start()
        self.forwards_after_cancel = 0  # this request's forwards that finished after its cancel
        # Test-only switch: make each forward slow enough to cancel mid-generation with a tiny model.
        self.test_delay_s = float(os.environ.get("DRAFTWISE_TEST_FORWARD_DELAY_MS", "0") or 0) / 1000.0

    def read_ahead(self, ids: list[int], document: str, cancel: CancelToken) -> int:
        """Idle work: extend the stored cache for `document` to hold ids[:-1], as the request that will
        send these ids needs it. A cancel stops it between chunks and keeps what was read. Returns the
        tokens read."""
        reused = self.start(ids, document, cancel)
        try:
            self.sync(ids, cancel)
        except Cancelled:
            pass
        except BaseException:
            self.discard()
            raise
        read = len(self.tokens) - reused
        self.finish()
        return read


class SavedCache:
    """A stored cache: the live cache's saved state and the tokens it holds."""

    def __init__(self, state: Any, tokens: list[int]):
        self.state = state  # None: not saved yet, the live cache holds it (OneLiveCache._unsaved)
        self.tokens = tokens  # its own copy: KVStore crops the list it is handed

    def crop(self, n: int) -> None:
        """KVStore's call (n < 0: keep all but the last -n tokens). Nothing to do on the state: the
        runner drops what is not wanted from the live cache after restoring it."""


class OneLiveCache(Runner):
    """A runner whose model holds one cache in place (llama.cpp's sequence, a static KV buffer).

    A finished request's cache goes to the KVStore as an entry that the live cache still holds; only
    when another document's request needs the live cache is it saved (a copy of its state), so
    switching documents restores a cache instead of reading the prompt again, and typing in one
    document never pays for a copy. Subclasses implement the five primitives below."""

    def _live_decode(self, ids: list[int], position: int, keep: int) -> torch.Tensor:
        raise NotImplementedError

    def _live_drop_from(self, position: int) -> None:
        raise NotImplementedError

    def _live_clear(self) -> None:
        raise NotImplementedError

    def _live_save(self) -> Any:
        raise NotImplementedError

    def _live_restore(self, state: Any) -> None:
        raise NotImplementedError

    def _init_live(self, kv_bytes_per_token: int, cache_budget_bytes: int) -> None:
        self.store = KVStore(kv_bytes_per_token, cache_budget_bytes)
        self._live: list[int] = []  # what the live cache holds right now
        self._unsaved: SavedCache | None = None  # the stored entry only the live cache holds

    def start(self, ids: list[int], document: str, cancel: CancelToken | None = None) -> int:
        """Take the best stored cache for this prompt; returns how many prompt tokens it covers."""
        self.document = document
        self.cancel, self.forwards_after_cancel = cancel, 0
        got = self.store.take(ids, document)
        saved, tokens = got if got is not None else (None, [])
        if saved is not None and saved is self._unsaved:
            self._unsaved = None  # its own document took it back: the live cache is its cache
        else:
            self._save_unsaved()  # the live cache is about to change for another cache
        live = common_prefix_len(self._live, tokens) == len(tokens)
        if saved is None or (not live and saved.state is None):
            self._reset_live()
            self.tokens = []
            return 0
        if not live:  # the live cache holds something else now
            self._live_restore(saved.state)
            self._live = list(saved.tokens)
        self._crop_live(len(tokens))
        self.tokens = list(tokens)
        return len(tokens)

    def finish(self) -> None:
        """Hand the cache back to the store for later requests."""
        if self.tokens:
            self._unsaved = SavedCache(None, list(self.tokens))
            self.store.put(self._unsaved, list(self.tokens), self.document)
        self.tokens = []

    def _save_unsaved(self) -> None:
        """Give the stored entry that only the live cache holds its state (if the store still keeps
        it), before that cache is cropped, restored over or cleared."""
        entry, self._unsaved = self._unsaved, None
        if entry is not None and self.store.holds(entry):
            # Nothing ran on the live cache since finish(): it holds exactly entry.tokens. The crop
            # guarantees the saved state is those tokens and no more.
            self._crop_live(len(entry.tokens))
            entry.state = self._live_save()

    def discard(self) -> None:
        """Drop the live cache: after an error mid-forward it may not match self.tokens."""
        self._reset_live()
        self.tokens = []

    def crop_to(self, n: int) -> None:
        if n < len(self.tokens):
            self._crop_live(n)
            del self.tokens[n:]

    def forward(self, ids: list[int], logits_to_keep: int | None = None) -> torch.Tensor:
        """Append ids to the cache; return float logits [keep, V] for the last `keep` positions."""
        keep = len(ids) if logits_to_keep is None else logits_to_keep
        try:
            logits = self._live_decode(ids, len(self._live), keep)
        except BaseException:
            self._reset_live()  # a failed forward may leave part of the batch in the cache
            raise
        self._live.extend(ids)
        self.tokens.extend(ids)
        self._counted()
        return logits

    def _crop_live(self, n: int) -> None:
        if n < len(self._live):
            self._live_drop_from(n)
            del self._live[n:]

    def _reset_live(self) -> None:
        self._live_clear()
        self._live = []
