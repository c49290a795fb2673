"""A GGUF file loaded by llama.cpp through llama-cpp-python's ctypes bindings (the optional `llamacpp`
extra), rather than its `Llama` class: a verify forward asks for logits at only the drafted positions,
and nothing allocates a logits buffer per context position. decoding/runners/llamacpp.py runs it."""
from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import numpy as np

from decoding.errors import ModelLoadError

log = logging.getLogger(__name__)

SEQ = 0  # the one llama.cpp sequence the live cache lives in
MAX_FORWARD = 512  # tokens per llama_decode call (prefill chunks; verify forwards are far smaller)


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
            raise RuntimeError(f"{n} tokens at position {position} do not fit llama.cpp's context "
                               f"(batch {MAX_FORWARD}, context {self.n_ctx} tokens)")
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
