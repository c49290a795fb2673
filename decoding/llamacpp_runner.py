"""The target on llama.cpp: the `gguf` weight format.

The preset's GGUF file (its published Q4_K_M weights) runs on llama.cpp's quantized CPU kernels, the
fastest forward on a CPU here, under the same verify loop as the PyTorch formats: `LlamaCppRunner`
keeps ModelRunner's contract (forward, crop_to, sync, start/finish with a store of caches per
document), so drafting, verification, stop rules and cancellation are the engine's own. It talks to
llama.cpp's C API (through llama-cpp-python's ctypes bindings, the optional `llamacpp` extra) rather
than its `Llama` class: a verify forward asks for logits at only the drafted positions, and nothing
allocates a logits buffer per context position.

One llama.cpp sequence holds the live cache. A finished request's cache goes to the same KVStore the
PyTorch runner uses, as an entry that the live sequence still holds; only when another document's
request needs the sequence is it saved as llama.cpp's sequence state (its bytes, ~12 KB a token for
the 0.5B: ~14 ms for 1,000 tokens here), so switching documents restores a cache instead of reading
the prompt again, and typing in one document never pays for a copy.
"""
from __future__ import annotations

import ctypes
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from decoding.api import CancelToken
from decoding.errors import ModelLoadError
from decoding.kv_cache import KVStore, common_prefix_len
from decoding.runner import PREFILL_CHUNK, PrefixSync, synthetic_tokens

log = logging.getLogger(__name__)

SEQ = 0  # the one llama.cpp sequence the live cache lives in
MAX_FORWARD = PREFILL_CHUNK  # tokens per llama_decode call (prefill chunks; verify forwards are far smaller)


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def _quiet_llama_cpp_logs() -> None:
    """llama.cpp reports every load and context in detail on stderr; keep its errors only (as
    llama-cpp-python's Llama(verbose=False) does). Never stdout: that is the LSP channel."""
    try:
        from llama_cpp._logger import set_verbose
    except ImportError:  # a release without it logs as llama.cpp does, on stderr
        return
    set_verbose(log.isEnabledFor(logging.DEBUG))


class LlamaCppModel:
    """A GGUF file loaded by llama.cpp, with one context sized for the engine's prompts."""

    def __init__(self, gguf: Path, context_tokens: int, threads: int | None = None) -> None:
        try:
            import llama_cpp
        except ImportError as exc:
            raise ModelLoadError("the gguf weight format needs llama.cpp: pip install 'draftwise[llamacpp]'") from exc
        self.lib, self.path = llama_cpp, Path(gguf)
        _quiet_llama_cpp_logs()
        llama_cpp.llama_backend_init()
        self.model = llama_cpp.llama_model_load_from_file(str(gguf).encode(), llama_cpp.llama_model_default_params())
        if not self.model:
            raise ModelLoadError(f"llama.cpp could not load {gguf}")
        threads = threads or os.cpu_count() or 1
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = context_tokens
        params.n_batch = params.n_ubatch = MAX_FORWARD
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = threads
        self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise ModelLoadError(f"llama.cpp could not make a {context_tokens}-token context for {gguf}")
        self.n_ctx = llama_cpp.llama_n_ctx(self.ctx)
        self.vocab_size = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(MAX_FORWARD, 0, 1)
        self.kv_bytes_per_token = self._measure_state_bytes_per_token()
        self._verify_difference: float | None = None

    def _measure_state_bytes_per_token(self) -> int:
        """The saved state's size per token, from two forwards' worth (a fixed header cancels out)."""
        sizes = []
        for n in (1, 9):
            self.decode(list(range(10, 10 + n)), 0, keep=1)
            sizes.append(self.lib.llama_state_seq_get_size(self.ctx, SEQ))
            self.lib.llama_memory_clear(self.memory, True)
        return max(1, (sizes[1] - sizes[0]) // 8)

    def decode(self, ids: list[int], position: int, keep: int) -> np.ndarray:
        """Feed ids at positions position..; the logits [keep, V] of the last `keep` of them."""
        batch, n = self.batch, len(ids)
        if n > MAX_FORWARD or position + n > self.n_ctx:
            raise ValueError(f"{n} tokens at position {position} do not fit (batch {MAX_FORWARD}, context {self.n_ctx})")
        for i, token in enumerate(ids):
            batch.token[i], batch.pos[i] = token, position + i
            batch.n_seq_id[i], batch.seq_id[i][0] = 1, SEQ
            batch.logits[i] = i >= n - keep
        batch.n_tokens = n
        status = self.lib.llama_decode(self.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status}")
        out = np.empty((keep, self.vocab_size), dtype=np.float32)
        for row, i in enumerate(range(n - keep, n)):
            out[row] = np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.ctx, i), shape=(self.vocab_size,))
        return out

    def verify_difference(self, tokens: int = 5, context: int = 64) -> float:
        """How far a `tokens`-token forward's logits are from as many one-token forwards' (largest
        absolute difference; 0.0 means bit for bit). Verification is lossless only at 0.0: a k-token
        forward that computes a row differently from a decode step can change the greedy text.
        Measured once per loaded model: every runner over it (timing, then serving) reads the same."""
        if self._verify_difference is None:
            self._verify_difference = self._measure_verify_difference(tokens, context)
        return self._verify_difference

    def _measure_verify_difference(self, tokens: int, context: int) -> float:
        ids = synthetic_tokens(self.vocab_size, context + tokens)
        try:
            self.decode(ids[:context], 0, keep=1)
            batch = self.decode(ids[context:], context, keep=tokens)
            self.remove_from(context)
            steps = np.concatenate([self.decode([t], context + i, keep=1) for i, t in enumerate(ids[context:])])
        finally:
            self.lib.llama_memory_clear(self.memory, True)
        return float(np.abs(batch - steps).max())

    def remove_from(self, position: int) -> None:
        if not self.lib.llama_memory_seq_rm(self.memory, SEQ, position, -1):
            raise RuntimeError(f"llama.cpp could not drop the cache from position {position}")

    def save(self) -> bytes:
        size = self.lib.llama_state_seq_get_size(self.ctx, SEQ)
        buffer = (ctypes.c_uint8 * size)()
        written = self.lib.llama_state_seq_get_data(self.ctx, buffer, size, SEQ)
        return ctypes.string_at(buffer, written)  # one copy; slicing a ctypes array makes a list of ints

    def restore(self, state: bytes) -> None:
        self.lib.llama_memory_clear(self.memory, True)
        buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if self.lib.llama_state_seq_set_data(self.ctx, buffer, len(state), SEQ) == 0:
            raise RuntimeError("llama.cpp could not restore a saved cache")

    def close(self) -> None:
        if getattr(self, "ctx", None):
            self.lib.llama_batch_free(self.batch)
            self.lib.llama_free(self.ctx)
            self.lib.llama_model_free(self.model)
            self.ctx = self.model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


@dataclass
class SavedState:
    """A stored cache: llama.cpp's sequence state and the tokens it holds."""

    state: bytes | None  # None: not saved yet, the live sequence holds it (LlamaCppRunner._unsaved)
    tokens: list[int]  # its own copy: KVStore crops the list it is handed

    def crop(self, n: int) -> None:
        """KVStore's call (n < 0: keep all but the last -n tokens). Nothing to do on the bytes: the
        runner drops what is not wanted from the live sequence after restoring them."""


class LlamaCppRunner(PrefixSync):
    """ModelRunner's contract on llama.cpp (see decoding/runner.py for the invariant on `tokens`)."""

    # Prompt tokens a request's first forward reads with the last one, instead of a prefill forward of
    # their own. A keystroke changes the last few prompt tokens; on a 2-core CPU llama.cpp reads 2
    # tokens in about the time of 2 single ones but 4 in no more, so this saves about one decode step
    # before the first token. Drafting is on only where a verify row equals a decode step
    # (verify_exact), so plain and drafted decoding read these tokens alike.
    prompt_tail = 16

    def __init__(self, loaded, cache_budget_bytes: int, role: str = "target") -> None:
        self.role, self.loaded = role, loaded
        self.model: LlamaCppModel = loaded.model
        # Measured, not assumed: this build's kernels may compute a verify row unlike a decode step.
        self.verify_difference = self.model.verify_difference()
        self.verify_exact = self.verify_difference == 0.0
        self.device = loaded.device
        self.vocab_size = self.model.vocab_size
        self.store = KVStore(self.model.kv_bytes_per_token, cache_budget_bytes)
        self.tokens: list[int] = []
        self.document = ""
        self.forwards = 0
        self.cancel: CancelToken | None = None
        self.forwards_after_cancel = 0
        self.test_delay_s = float(os.environ.get("DRAFTWISE_TEST_FORWARD_DELAY_MS", "0") or 0) / 1000.0
        self._live: list[int] = []  # what the llama.cpp sequence holds right now
        self._unsaved: SavedState | None = None  # the stored entry only the live sequence holds

    def start(self, ids: list[int], document: str, cancel: CancelToken | None = None) -> int:
        self.document = document
        self.cancel, self.forwards_after_cancel = cancel, 0
        got = self.store.take(ids, document)
        saved, tokens = got if got is not None else (None, [])
        if saved is not None and saved is self._unsaved:
            self._unsaved = None  # its own document took it back: the live sequence is its cache
        else:
            self._save_unsaved()  # the live sequence is about to change for another cache
        live = common_prefix_len(self._live, tokens) == len(tokens)
        if saved is None or (not live and saved.state is None):
            self._reset_live()
            self.tokens = []
            return 0
        if not live:  # the live sequence holds something else now
            self.model.restore(saved.state)
            self._live = list(saved.tokens)
        self._crop_live(len(tokens))
        self.tokens = list(tokens)
        return len(tokens)

    def finish(self) -> None:
        if self.tokens:
            self._unsaved = SavedState(None, list(self.tokens))
            self.store.put(self._unsaved, list(self.tokens), self.document)
        self.tokens = []

    def _save_unsaved(self) -> None:
        """Give the stored entry that only the live sequence holds its bytes (if the store still
        keeps it), before that sequence is cropped, restored over or cleared."""
        entry, self._unsaved = self._unsaved, None
        if entry is not None and self.store.holds(entry):
            # Nothing ran on the sequence since finish(): it holds exactly entry.tokens. The crop
            # guarantees the saved bytes are those tokens and no more.
            self._crop_live(len(entry.tokens))
            entry.state = self.model.save()

    def discard(self) -> None:
        self._reset_live()
        self.tokens = []

    def crop_to(self, n: int) -> None:
        if n < len(self.tokens):
            self._crop_live(n)
            del self.tokens[n:]

    def forward(self, ids: list[int], logits_to_keep: int | None = None) -> torch.Tensor:
        keep = len(ids) if logits_to_keep is None else logits_to_keep
        try:
            logits = self.model.decode(ids, len(self._live), keep)
        except BaseException:
            self._reset_live()  # a failed decode may leave part of the batch in the cache
            raise
        self._live.extend(ids)
        self.tokens.extend(ids)
        self.forwards += 1
        if self.test_delay_s:
            time.sleep(self.test_delay_s)
        if self.cancel is not None and self.cancel.cancelled:
            self.forwards_after_cancel += 1
        return torch.from_numpy(logits)

    def _crop_live(self, n: int) -> None:
        if n < len(self._live):
            self.model.remove_from(n)
            del self._live[n:]

    def _reset_live(self) -> None:
        self.model.lib.llama_memory_clear(self.model.memory, True)
        self._live = []
