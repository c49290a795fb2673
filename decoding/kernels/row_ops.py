"""The static forward's float ops between its integer matmuls, made to compute a row the same way
whatever the number of rows and of threads (decoding/models/static_decoder.py uses them).

Two ops are not so in torch beyond two threads (measured with `torch.set_num_threads(n)`):
- element-wise ops split a tensor among threads at element offsets, not rows; where a split is not a
  multiple of the vector width, some elements take ATen's scalar tail (`std::exp` for SiLU) and not
  its vector code: `F.silu` over 14..17 rows of the 0.5B's 4,864 differed from rows one at a time at
  3 threads and more. `silu` here calls it on few enough rows at a time that ATen runs each call on
  one thread (fewer elements than its grain size), so every row takes the same code;
- attention's probabilities-times-values product: BLAS split a 14-row verify forward's another way
  at 8 threads. row_ops.cpp computes attention a (row, head) per task in an order of its own
  (row_ops_core.h), the same bits from every instruction set's build (plain C++ where the CPU has
  no vector path, DRAFTWISE_ISA=portable) and every compiler; built once per machine, like the int8
  kernel. Without a C++ compiler attention runs on torch's batched matmul with its threads held to
  one: a single thread never split a row's sums in any measurement, but that is BLAS's choice, not a
  promise, so that forward is not exact by construction and does not draft on a CPU
  (decoding/runners/static.py).
"""
from __future__ import annotations

import contextlib
import functools
import logging
from pathlib import Path

import torch
from torch.nn import functional as F

from decoding.kernels import build as kernel_build

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("row_ops.cpp")
# ATen runs an element-wise op on one thread below this many elements (at::internal::GRAIN_SIZE)
GRAIN_SIZE = 32768
HEAD_SIZES = (16, 32, 64, 80, 96, 128, 256)  # row_ops_core.h's cases


@functools.lru_cache(maxsize=1)
def problem() -> str | None:
    """Why the attention kernel cannot run here (None: built and loaded)."""
    isa = kernel_build.isa()
    why = kernel_build.build("draftwise_row_ops", SOURCE, kernel_build.vector_flags(isa), "attention")
    if why is None:
        built = torch.ops.draftwise_rows.build_info()
        (log.warning if "one thread" in built else log.debug)("attention kernel for %s: %s", isa, built)
    return why


def attention_kernel(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether row_ops.cpp's attention serves a model of this compute dtype and head size."""
    return dtype == torch.float32 and head_dim in HEAD_SIZES and problem() is None


def causal_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
    """q [n, heads, d] (scaled) over one layer's cache [kv_heads, len, d], row r seeing positions
    0..start+r: [n, heads * d]."""
    return torch.ops.draftwise_rows.causal_attention(q.contiguous(), keys, values, start)


def silu(x: torch.Tensor) -> torch.Tensor:
    """F.silu over the rows of a 2-D tensor, each row by the same code at any thread count."""
    n, width = x.shape
    rows = max(1, (GRAIN_SIZE - 1) // max(width, 1))
    if n <= rows:
        return F.silu(x)
    return torch.cat([F.silu(part) for part in x.split(rows)])


@contextlib.contextmanager
def one_thread():
    """torch's ops on one thread inside (the attention fallback's batched matmuls)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
