"""The target on llama.cpp: the `gguf` weight format.

The preset's GGUF file (its published Q4_K_M weights) runs on llama.cpp's quantized CPU kernels
(decoding/models/llamacpp_model.py) under the same verify loop as the PyTorch formats, so drafting,
verification, stop rules and cancellation are the engine's own. One llama.cpp sequence holds the live
cache (OneLiveCache); a saved cache is llama.cpp's sequence state (~12 KB a token for the 0.5B:
~14 ms for 1,000 tokens here). Drafts are as wide as the exactness probe found llama.cpp's k-token
forwards equal to k one-token steps (decoding/runners/exactness.py).
"""
from __future__ import annotations

import torch

from decoding.models.llamacpp_model import MAX_FORWARD, LlamaCppModel
from decoding.runners.base import OneLiveCache


class LlamaCppRunner(OneLiveCache):
    # Prompt tokens a request's first forward reads with the last one, instead of a prefill forward of
    # their own. A keystroke changes the last few prompt tokens; on a 2-core CPU llama.cpp reads 2
    # tokens in about the time of 2 single ones but 4 in no more, so this saves about one decode step
    # before the first token. Kept only where the probe finds forwards this wide exact (else 1).
    prompt_tail = 16
    path = "llama.cpp"
    prefill_chunk = MAX_FORWARD

    def __init__(self, loaded, cache_budget_bytes: int, role: str = "target") -> None:
        self._init_bookkeeping(role, loaded)
        self.model: LlamaCppModel = loaded.model
        self.vocab_size = self.model.vocab_size
        self._init_live(self.model.kv_bytes_per_token, cache_budget_bytes)

    @property
    def max_positions(self) -> int:
        return self.model.n_ctx

    @property
    def context_limit(self) -> int:
        """llama.cpp's context cannot grow: prompts are fitted to it (LoadedModels.prompt_parts)."""
        return self.model.n_ctx

    def _live_decode(self, ids: list[int], position: int, keep: int) -> torch.Tensor:
        return torch.from_numpy(self.model.decode(ids, position, keep))

    def _live_drop_from(self, position: int) -> None:
        self.model.remove_from(position)

    def _live_clear(self) -> None:
        self.model.lib.llama_memory_clear(self.model.memory, True)

    def _live_save(self) -> bytes:
        return self.model.save()

    def _live_restore(self, state: bytes) -> None:
        self.model.restore(state)
