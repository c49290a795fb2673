"""The quantized formats (int8, int4) on the static-shape forward (decoding/models/static_decoder.py):
one KV buffer per model holds the live cache in place, saved caches are copies of its first n
positions, and every verify row is a decode step bit for bit (the exactness probe checks it)."""
from __future__ import annotations

import torch

from decoding.runners.base import OneLiveCache

# Prefill chunk: the int8 matmul costs about as much per token at 128 rows as at 512 (oneDNN's
# blocking), and a smaller chunk lets a cancel land sooner.
STATIC_PREFILL_CHUNK = 256


class StaticRunner(OneLiveCache):
    exact_by_construction = True
    prefill_chunk = STATIC_PREFILL_CHUNK

    def __init__(self, loaded, cache_budget_bytes: int, role: str = "target") -> None:
        from decoding.models.weights import kernel

        self._init_bookkeeping(role, loaded)
        # Integer sums are exact in any order (draftwise's kernels, torch's _int_mm). ATen's int4
        # kernel, which runs only where ours cannot, takes another path for several rows on CPUs with
        # AMX (a 17-row forward 0.1 away from one-token steps, seen on a Xeon): not exact by
        # construction, so no probe result makes it draft on a CPU.
        self.exact_by_construction = not kernel(loaded.weights).startswith("aten")
        self.model = loaded.model  # a StaticDecoder
        self.vocab_size = self.model.vocab_size
        self._init_live(self.model.kv_bytes_per_token, cache_budget_bytes)

    @property
    def max_positions(self) -> int:
        """Positions the cache holds without growing (the exactness probe tests near it)."""
        return self.model.max_len

    # ---- the live cache -------------------------------------------------------------------------
    def assume_cached(self, ids: list[int]) -> None:
        """Take the buffer's first len(ids) positions as these tokens' cache, whatever they hold: the
        exactness probe compares forwards over one cache and needs no real prompt read first."""
        self.model.grow(len(ids) + 64)
        self._live, self.tokens = list(ids), list(ids)

    @torch.inference_mode()
    def _live_decode(self, ids: list[int], position: int, keep: int) -> torch.Tensor:
        return self.model(torch.tensor(ids, dtype=torch.long), position, keep)

    def _live_drop_from(self, position: int) -> None:
        """Nothing to do: positions past the live ones are masked, and overwritten when reached."""

    def _live_clear(self) -> None:
        pass

    def _live_save(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self._live)
        return self.model.k_cache[:, :, :n].clone(), self.model.v_cache[:, :, :n].clone()

    def _live_restore(self, state: tuple[torch.Tensor, torch.Tensor]) -> None:
        k, v = state
        self.model.grow(k.shape[2])
        self.model.k_cache[:, :, :k.shape[2]] = k
        self.model.v_cache[:, :, :v.shape[2]] = v
