"""The quantized formats (int8, int4) on the static-shape forward (decoding/models/static_decoder.py):
one KV buffer per model holds the live cache in place, saved caches are copies of its first n
positions, and every verify row is a decode step bit for bit where every op of the forward is
row-exact by construction (`not_exact_by_construction`; the exactness probe checks it)."""
from __future__ import annotations

import torch

from decoding.runners.base import OneLiveCache

# Prefill chunk: the int8 matmul costs about as much per token at 128 rows as at 512 (oneDNN's
# blocking), and a smaller chunk lets a cancel land sooner.
STATIC_PREFILL_CHUNK = 256


def not_exact_by_construction(model) -> str | None:
    """Why some op of this decoder's forward, as it runs here, is not row-exact by construction (None:
    every one is). Row-exact by construction: the linear layers on integer sums (draftwise's kernels,
    or torch's `_int_mm` where its sums do not saturate), attention on row_ops.cpp, SiLU in pieces of
    one thread each and norms along a row (decoding/models/static_decoder.py). Not: ATen's int4
    kernel (bf16 activations; a 17-row forward took another path than one-token steps on a Xeon with
    AMX, 0.1 apart), float matmuls (BLAS picks kernels by the number of rows), and attention on
    torch's batched matmuls (each row's sums split as BLAS chooses, held to one thread: never seen to
    differ, but not a promise)."""
    from decoding.kernels import integer_linear, row_ops
    from decoding.models.static_decoder import Dense
    from decoding.models.weights import Int4Linear, Int8Linear, int_mm_exact

    for name, module in model.named_modules():
        if isinstance(module, Int4Linear):
            return f"{name} runs on ATen's int4 kernel ({integer_linear.problem() or 'a shape ours does not take'})"
        if isinstance(module, Dense):
            return f"{name} runs on a float matmul"
        if isinstance(module, Int8Linear) and not module.vnni and not int_mm_exact():
            return f"{name} runs on torch's _int_mm, whose int8 sums saturate on this CPU"
    if not model.attention_kernel:
        if model.dtype != torch.float32:
            why = f"{str(model.dtype).replace('torch.', '')} activations"
        elif model.head_dim not in row_ops.HEAD_SIZES:
            why = f"head size {model.head_dim}"
        else:
            why = row_ops.problem() or "not loaded"
        return f"attention runs on torch's batched matmuls, the attention kernel (row_ops.cpp) not running here: {why}"
    return None


class StaticRunner(OneLiveCache):
    exact_by_construction = True
    prefill_chunk = STATIC_PREFILL_CHUNK
    # The KV buffer grows when a sequence outgrows it: the exactness probe checks a verify forward
    # across that resize (decoding/runners/exactness.py).
    resizes = True

    def __init__(self, loaded, cache_budget_bytes: int, role: str = "target") -> None:
        self._init_bookkeeping(role, loaded)
        self.model = loaded.model  # a StaticDecoder
        self.not_by_construction = not_exact_by_construction(self.model)
        self.exact_by_construction = self.not_by_construction is None
        self.vocab_size = self.model.vocab_size
        # the size every start's buffer has before its first long sequence (assume_cached returns to it)
        self.initial_positions = self.model.max_len
        self._init_live(self.model.kv_bytes_per_token, cache_budget_bytes)

    @property
    def max_positions(self) -> int:
        """Positions the cache holds without growing (the exactness probe tests a forward across it)."""
        return self.model.max_len

    # ---- the live cache -------------------------------------------------------------------------
    def assume_cached(self, ids: list[int]) -> None:
        """Take the buffer's first len(ids) positions as these tokens' cache, whatever they hold: the
        exactness probe compares forwards over one cache and needs no real prompt read first. A buffer
        a forward grew goes back to the size it had when the runner was made (its first positions
        kept): so the probe's next forward crosses the buffer's end where a request's would, and a
        first start leaves the buffer every later start has."""
        n = len(ids)
        if self.model.max_len != self.initial_positions and n <= self.initial_positions:
            k, v = self.model.k_cache[:, :, :n].clone(), self.model.v_cache[:, :, :n].clone()
            self.model.resize(self.initial_positions)
            self.model.k_cache[:, :, :n] = k
            self.model.v_cache[:, :, :n] = v
        self.model.grow(n)
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
