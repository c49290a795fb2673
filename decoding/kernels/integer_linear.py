"""int4 and int8 weights x int8 activations: avx512vnni.cpp (AVX-512 VNNI), avx2.cpp (AVX2, or
AVX-VNNI built with DRAFTWISE_AVXVNNI) or neon.cpp (aarch64), built once per machine.

The int4 format's linears run here where the CPU has AVX-512 VNNI, AVX-VNNI, AVX2 or ARM's dot product (and a C++ compiler),
else on ATen's int4 kernel (decoding/models/weights.py: Int4Linear); so do Int8Linear's (the int8
format's layers, both quantized formats' lm_head), else on `torch._int_mm`, to the same bits. Why,
and the layouts: the .cpp file's comments. The extension is built by torch's cpp_extension (ninja) into
$DRAFTWISE_HOME/extensions the first time (decoding/kernels/build.py) and loaded from there afterwards.
"""
from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import torch
from torch import nn

from decoding.kernels import build as kernel_build

log = logging.getLogger(__name__)

GROUP = 32  # inputs per scale and low: Q4_1's group, 5 bits a weight with fp16 scales and lows
BLOCK = 16  # outputs per block: one 32-bit lane each of a 512-bit register
SOURCE = Path(__file__).with_name("avx512vnni.cpp")


# the kernel's source and compiler flags on each instruction set it is written for
SOURCES = {
    "avx512vnni": (SOURCE, ["-mavx512f", "-mavx512bw", "-mavx512vnni", "-mf16c", "-mfma"]),
    "avxvnni": (SOURCE.with_name("avx2.cpp"), ["-mavx2", "-mfma", "-mf16c", "-mavxvnni",
                                                         "-DDRAFTWISE_AVXVNNI"]),
    "avx2": (SOURCE.with_name("avx2.cpp"), ["-mavx2", "-mfma", "-mf16c"]),
    "neon": (SOURCE.with_name("neon.cpp"), ["-march=armv8.2-a+dotprod"]),
}


@functools.lru_cache(maxsize=1)
def problem() -> str | None:
    """Why the kernel cannot run here (None: it is built and loaded)."""
    isa = kernel_build.isa()
    if isa not in SOURCES:
        forced = os.environ.get("DRAFTWISE_ISA", "auto") not in ("", "auto")
        return f"DRAFTWISE_ISA={isa}" if forced else f"no kernel for {isa} CPUs"
    if isa == "neon" and not kernel_build.arm_dot_product():
        return "the CPU lacks ARM's dot-product extension (asimddp)"
    source, flags = SOURCES[isa]
    return kernel_build.build("draftwise_integer_linear", source, flags, "int8/int4")


REFITS = 4  # least-squares refits of each group's grid to its codes (grid_fit.h)


def pack(weight: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K] as 4-bit codes per group of `group` inputs (a weight is code * scale + low), in
    the kernel's layout: (packed, scales, lows). Each group's grid is the one of least squared error
    among min..max in 11-15 steps and refits (grid_fit.h says why): the presets' weights come from a
    GGUF file, where a Q4_K group's values lie on a grid of 16 levels that needs not reach both ends
    of 0..15; the usual min..max grid then puts every value off its level (4.3% RMS error on the 0.5B's
    down projections), the fit finds it (0.07%). The kernel's extension fits them: packing runs where
    the kernel does."""
    if not load():
        raise RuntimeError(f"int4 packing needs draftwise's kernel: {problem()}")
    w = weight.detach().float()
    n, k = w.shape
    scale, low, codes = torch.ops.draftwise.fit_int4_grids(w.reshape(-1, group).contiguous(), REFITS)
    # fp16, as the kernel reads them: the codes were chosen against those
    scale, low = scale.half().reshape(n, k // group), low.half().reshape(n, k // group)
    codes = codes.reshape(n // BLOCK, BLOCK, k // 8, 2, 4)  # block, lane, step, nibble, byte
    packed = (codes[:, :, :, 0] | (codes[:, :, :, 1] << 4)).permute(0, 2, 1, 3).reshape(n // BLOCK, k // 8, 64)

    def per_block(t: torch.Tensor) -> torch.Tensor:  # [N, K/group] -> [N/16, K/group, 16]
        return t.reshape(n // BLOCK, BLOCK, k // group).permute(0, 2, 1).contiguous()

    return packed.contiguous(), per_block(scale), per_block(low)


def unpack(packed: torch.Tensor, scales: torch.Tensor, lows: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """The float weights [N, K] the kernel computes with (for tests and comparisons)."""
    blocks, steps, _ = packed.shape
    b = packed.reshape(blocks, steps, BLOCK, 4)
    codes = torch.stack([b & 0x0F, b >> 4], dim=3)  # block, step, lane, nibble, byte
    codes = codes.permute(0, 2, 1, 3, 4).reshape(blocks * BLOCK, steps * 8).float()
    n, k = codes.shape
    sc = scales.float().permute(0, 2, 1).reshape(n, k // group).repeat_interleave(group, dim=1)
    lo = lows.float().permute(0, 2, 1).reshape(n, k // group).repeat_interleave(group, dim=1)
    return codes * sc + lo


def fits(out_features: int, in_features: int, group: int = GROUP) -> bool:
    return out_features % BLOCK == 0 and in_features % group == 0


def fits_int8(out_features: int, in_features: int) -> bool:
    return out_features % BLOCK == 0 and in_features % 4 == 0


def pack_int8(qweight: torch.Tensor) -> torch.Tensor:
    """int8 weights [N, K] in q8_linear's layout [N/16, K/4, 64]: per block of 16 outputs and step of 4
    inputs, lane j's 4 bytes are output 16b+j's weights at those inputs."""
    n, k = qweight.shape
    return qweight.reshape(n // BLOCK, BLOCK, k // 4, 4).permute(0, 2, 1, 3).reshape(n // BLOCK, k // 4, 64).contiguous()


def unpack_int8(packed: torch.Tensor) -> torch.Tensor:
    """pack_int8's inverse: [N, K]."""
    blocks, steps, _ = packed.shape
    return packed.reshape(blocks, steps, BLOCK, 4).permute(0, 2, 1, 3).reshape(blocks * BLOCK, steps * 4)


def int8_rows_of(packed: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of pack_int8's weights, [*ids.shape, K] (an embedding tied to a packed lm_head)."""
    blocks, steps, _ = packed.shape
    rows = packed.view(blocks, steps, BLOCK, 4)[ids // BLOCK, :, ids % BLOCK, :]  # [*ids.shape, K/4, 4]
    return rows.reshape(*ids.shape, steps * 4)


@functools.lru_cache(maxsize=1)
def pack_code() -> str:
    """A hash of the code that packs (pack and grid_fit.h, whose grids are the same bits on every
    instruction set): kept packed layers are named by it, so packing code changed in any way is never
    served another version's codes."""
    from decoding.home.cache_files import code_hash

    fit = SOURCE.with_name("grid_fit.h").read_text()
    return code_hash(pack, extra=f"{fit} {REFITS} {BLOCK}")


def cached_pack(weight: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pack(), kept on disk under $DRAFTWISE_HOME/packed by the weight's content: fitting each
    group's grid reads its weights ~150 times (a few seconds for the 1.5B on 2 cores), a file loads
    in less. A home that cannot be written only costs the next load the fitting again."""
    return _cached_pack(weight, group)[0]


def _cached_pack(weight: torch.Tensor, group: int, keep: bool = True):
    """(cached_pack's tensors, the file they are kept in or None). Kept until the quantized model they
    go into is (decoding/models/quantized_store.py removes them then). Two processes packing the same
    layer: the second waits for the first's file."""
    import hashlib

    from decoding.home import cache_files, paths

    w = weight.detach().float().contiguous()
    n, k = w.shape
    if w.is_meta:  # a layout only (decoding/models/quantized_store.py fills it from disk)
        grid = torch.empty(n // BLOCK, k // group, BLOCK, dtype=torch.float16, device="meta")
        return (torch.empty(n // BLOCK, k // 8, 64, dtype=torch.uint8, device="meta"), grid, grid.clone()), None
    if not keep:
        return pack(w, group), None
    # sha256 over the tensor's own memory: the CPU's SHA instructions and no copy (blake2b over a copy
    # took ~10 s of the 1.5B's first start, this ~3.5 s)
    digest = hashlib.sha256(f"{n}x{k}".encode())
    if w.numel():
        digest.update(memoryview(w.numpy()).cast("B"))
    where = paths.draftwise_home() / "packed" / f"{digest.hexdigest()[:32]}-g{group}-{pack_code()}.safetensors"
    shapes = {"packed": ((n // BLOCK, k // 8, 64), torch.uint8), "scales": ((n // BLOCK, k // group, BLOCK), torch.float16),
              "lows": ((n // BLOCK, k // group, BLOCK), torch.float16)}
    if (kept := _read_packed(where, shapes)) is not None:
        return kept, where
    with cache_files.one_at_a_time(paths.draftwise_home(), "packed", where.name, "int4 layers"):
        if (kept := _read_packed(where, shapes)) is not None:  # packed by another process meanwhile
            return kept, where
        packed, scales, lows = pack(w, group)
        try:
            cache_files.write_tensors(where, {"packed": packed, "scales": scales, "lows": lows})
        except OSError as exc:
            cache_files.could_not_keep("packed int4 weights", where.parent, exc, "the next start packs them again")
            return (packed, scales, lows), None
    paths.evict_least_recently_used(where.parent, PACKED_BYTES)
    return (packed, scales, lows), where


def _read_packed(where, shapes: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The kept packed layer, or None: none kept, or one that cannot be read or is not this layer's
    layout (deleted: packed again)."""
    from safetensors.torch import load_file

    from decoding.home import cache_files

    try:
        seen = where.stat()
    except OSError:
        return None
    try:
        kept = load_file(str(where))
        tensors = tuple(kept[name] for name in shapes)
        for name, t in zip(shapes, tensors):
            if (tuple(t.shape), t.dtype) != shapes[name]:
                raise ValueError(f"{name} is {t.dtype} {list(t.shape)}, not {shapes[name][1]} {list(shapes[name][0])}")
    except cache_files.tensor_errors() as exc:
        cache_files.unreadable("kept packed int4 layer", where, exc, "packing it again")
        cache_files.discard(where, seen)
        return None
    cache_files.touch(where)
    return tensors


PACKED_BYTES = 3 << 30  # packed layers kept: a 1.5B's and a 0.5B's int4 layers with room to spare


class Q4Linear(nn.Module):
    """y = x @ W.T + bias with W in 4-bit codes and x quantized to int8 per row (avx512vnni.cpp)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group: int = GROUP, keep: bool = True):
        """keep: the packing is kept on disk (a model's layers; not a layer made to try the kernel)."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.group = group
        (packed, scales, lows), self.packed_file = _cached_pack(weight, group, keep)
        self.register_buffer("packed", packed)
        self.register_buffer("scales", scales)
        self.register_buffer("lows", lows)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        y = torch.ops.draftwise.q4_linear(rows, self.packed, self.scales, self.lows, self.group)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int4 codes in groups of {self.group}, int8 activations"


def load() -> bool:
    """Build or load the kernel (once a process); True when Q4Linear can run."""
    return problem() is None
