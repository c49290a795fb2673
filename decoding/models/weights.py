"""Weight formats: the checkpoint's fp32, bf16, or int8 / int4 weights quantized at load.

Lossless decoding needs one property from a format: a verify forward of k tokens must compute each
row exactly as a one-token decode step would, or a near-tie between two tokens can flip and the
speculative text drifts from plain decoding. Dense float matmuls do not promise that (BLAS picks
other kernels for other batch sizes). The quantized formats here do:
- int8: weights int8 per output channel, activations quantized to int8 per token (one scale per
  row, so a row's rounding never depends on its neighbours), products accumulated in int32 by
  `torch._int_mm` (oneDNN, VNNI where the CPU has it). Integer sums are exact in any order, so the
  result is bit-identical whatever the batch size. The embedding table is int8 rows too. The rest
  of the model computes in fp32.
- int4: on the static forward, where the CPU has AVX-512 VNNI, 4-bit codes in groups of 32 times
  activations quantized to int8 per row, summed in integers (decoding/kernels/integer_linear.py: our own
  kernel, each row computed alike whatever the batch); elsewhere ATen's CPU weight-only kernel
  (`_weight_int4pack_mm_for_cpu`, bf16 activations), which computes each row on its own.
- Attention is made row-exact for both (see `row_exact_attention`).

Why not a library: torchao's x86 wheels ship no CPU kernels and its eager int8 paths run slower
than fp32 here; `torch.ao.quantization.quantize_dynamic` (deprecated) takes one activation scale
per *tensor*, so a verify forward rounds differently from a decode step. What is ours is small: two
Linear replacements and the conversion below.
"""
from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from decoding.api import WEIGHT_FORMATS
from decoding.kernels import integer_linear

log = logging.getLogger(__name__)


FORMATS = WEIGHT_FORMATS[1:]  # the concrete ones
QUANTIZED = ("int8", "int4")
GGUF = "gguf"  # not a conversion: llama.cpp runs the model's GGUF file (decoding/runners/llamacpp.py)
INT4_GROUP_SIZES = (128, 64, 32)
ROW_EXACT_ATTENTION = "draftwise_row_exact"
# Forwards of at least this many tokens are prefill: plain and speculative decoding run the same
# ones, so they take the fast batched attention.
ROW_EXACT_BELOW = 64


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of `weight` as int8 with one scale (its largest magnitude maps to 127)."""
    if weight.is_meta:  # a layout only (decoding/models/quantized_store.py fills it)
        return (torch.empty(weight.shape, dtype=torch.int8, device="meta"),
                torch.empty(weight.shape[0], device="meta"))
    w = weight.detach().float()
    n = w.shape[0]
    codes = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scale = torch.empty(n, dtype=torch.float32, device=w.device)
    # A few hundred rows at a time, so each op's temporaries stay in cache instead of a fresh 6 GB
    # buffer per op for a 1.5B model (14 s of its first start, now ~3 s); the ops are per element
    # or per row, so the bits are those of one call over the whole weight.
    for i in range(0, n, INT8_ROWS_CHUNK):
        rows = w[i:i + INT8_ROWS_CHUNK]
        s = (rows.abs().amax(dim=1) / 127.0).clamp_(min=1e-12)
        scale[i:i + INT8_ROWS_CHUNK] = s
        codes[i:i + INT8_ROWS_CHUNK] = torch.round(rows / s[:, None]).clamp_(-127, 127)
    return codes, scale


INT8_ROWS_CHUNK = 256


def int4_groups(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight` [n, k] as asymmetric int4 in groups of `group` along k, packed for ATen's CPU kernel
    (`_weight_int4pack_mm_for_cpu`): (packed weights, bf16 scales and zeros)."""
    w = weight.detach().float()
    n, k = w.shape
    grouped = w.reshape(n, k // group, group)
    low, high = grouped.amin(-1, keepdim=True), grouped.amax(-1, keepdim=True)
    scale = ((high - low) / 15.0).clamp(min=1e-8)
    q = torch.round((grouped - low) / scale).clamp(0, 15).to(torch.int32).reshape(n, k)
    # The kernel computes (q - 8) * scale + zero, so zero is the value of the group's middle code.
    zero = low + 8 * scale
    scales_and_zeros = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], dim=-1).transpose(0, 1)
    packed = torch._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1)
    return packed, scales_and_zeros.contiguous().to(torch.bfloat16)


class Int8Linear(nn.Module):
    """y = dequant(int8(x) @ int8(W).T) + bias: per-token activation scales, per-channel weight scales.
    Where draftwise's kernel runs (decoding/kernels/integer_linear.py) the weights are kept in its layout and
    it computes the same bits as `_int_mm` here, twice as fast for the few rows of a step. A layer
    whose outputs are not a multiple of the kernel's blocks of 16 (an lm_head over an odd vocabulary)
    gets zero rows up to the next block, whose outputs are dropped: it runs on the kernel too, not on
    `_int_mm`, whose sums saturate on CPUs without VNNI."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        padded = -(-self.out_features // integer_linear.BLOCK) * integer_linear.BLOCK
        self.vnni = integer_linear.load() and integer_linear.fits_int8(padded, self.in_features)
        if self.vnni:
            if padded != self.out_features:
                qweight = torch.cat([qweight, qweight.new_zeros(padded - self.out_features, self.in_features)])
                scale = torch.cat([scale, scale.new_ones(padded - self.out_features)])
            # a layout only on the meta device (decoding/models/quantized_store.py fills it): its
            # reductions would import torch's symbolic shapes (~1.2 s of a start)
            sums = torch.empty(padded, dtype=torch.int32, device="meta") if qweight.is_meta \
                else qweight.sum(1, dtype=torch.int32)
            self.register_buffer("weight_sums", sums)
            qweight = integer_linear.pack_int8(qweight)
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        bias = None if linear.bias is None else linear.bias.detach().to(torch.float32, copy=True)
        return cls(*int8_rows(linear.weight), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        if self.vnni:
            y = torch.ops.draftwise.q8_linear(rows, self.qweight, self.weight_sums, self.scale)
            if y.shape[1] != self.out_features:
                y = y[:, :self.out_features]
        else:
            x_scale = (rows.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-12)
            xq = torch.round(rows / x_scale).clamp(-127, 127).to(torch.int8)
            y = torch._int_mm(xq, self.qweight.t()).float() * x_scale * self.scale
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        kernel = "VNNI kernel" if self.vnni else "_int_mm"
        return f"in={self.in_features}, out={self.out_features}, int8 weights and activations ({kernel})"


class Int8Embedding(nn.Module):
    """The token embedding as int8 rows, one scale each (Int8Linear's quantization, whose output
    channels are these rows): half of bf16's bytes for a quarter of a 0.5B model's weights. Where the
    lm_head is tied to it (Qwen's own checkpoints; the presets', made from their GGUF files, keep two
    matrices) it reads the int8 lm_head's buffers, and the matrix is stored once."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor):
        super().__init__()
        self.register_buffer("qweight", qweight)  # [N, K], or a tied lm_head's in q8_linear's layout
        self.register_buffer("scale", scale)

    @property
    def vnni(self) -> bool:
        return self.qweight.dim() == 3

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, tied_head: Int8Linear | None = None) -> "Int8Embedding":
        """tied_head: the int8 lm_head made from this same weight; its buffers are shared."""
        if tied_head is not None:
            return cls(tied_head.qweight, tied_head.scale)
        return cls(*int8_rows(embedding.weight))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.vnni:
            rows = integer_linear.int8_rows_of(self.qweight, ids)
        else:
            rows = F.embedding(ids, self.qweight)
        return rows.float() * self.scale[ids].unsqueeze(-1)

    def extra_repr(self) -> str:
        n = self.scale.shape[0]
        return f"{n} rows of {self.qweight.numel() // n}, int8 with a scale per row"


class CompactEmbedding(nn.Module):
    """The token embedding stored in bf16 and handed out in the model's compute dtype: a quarter of
    a 0.5B model's weights, read one row per token, so its precision costs nothing in speed."""

    def __init__(self, embedding: nn.Embedding, out_dtype: torch.dtype):
        super().__init__()
        self.register_buffer("table", embedding.weight.detach().to(torch.bfloat16))
        self.padding_idx, self.out_dtype = embedding.padding_idx, out_dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.table, self.padding_idx).to(self.out_dtype)


class Int4Linear(nn.Module):
    """Asymmetric int4 weights in groups along the input dimension, packed for ATen's CPU kernel."""

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int,
                 in_features: int, out_features: int, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int4Linear":
        n, k = linear.weight.shape
        group = next(g for g in INT4_GROUP_SIZES if k % g == 0)
        packed, scales_and_zeros = int4_groups(linear.weight, group)
        bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        return cls(packed, scales_and_zeros, group, k, n, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch._weight_int4pack_mm_for_cpu(rows, self.packed, self.group_size, self.scales_and_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int4 groups of {self.group_size}"


def _int4_fits(linear: nn.Linear) -> bool:
    n, k = linear.weight.shape
    return n % 8 == 0 and any(k % g == 0 for g in INT4_GROUP_SIZES)


def kernel(fmt: str) -> str:
    """What computes `fmt`'s matmuls and attention here: `q8` / `q4q8` (the VNNI kernels) or `intmm` /
    `aten` (torch's), with `+rows` where row_ops.cpp computes the static forward's attention."""
    from decoding.kernels import row_ops

    if fmt not in QUANTIZED:
        return "torch"
    vnni = integer_linear.load()
    matmul = ("q4q8" if vnni else "aten") if fmt == "int4" else ("q8" if vnni else "intmm")
    rows = compute_dtype(fmt) == torch.float32 and row_ops.problem() is None
    return matmul + ("+rows" if rows else "")


# The code whose changes change what a forward computes: kept measurements made with other code are
# made again.
FORWARD_CODE = ("weights.py", "static_decoder.py", "quantized_store.py", "../runners/static.py",
                "../runners/exactness.py", *(f"../kernels/{name}" for name in (
                    "integer_linear.py", "avx512vnni.cpp", "avx2.cpp", "neon.cpp", "neon_core.h", "ops.h",
                    "grid_fit.h", "parallel.h", "row_ops_core.h", "row_ops.py", "row_ops.cpp", "build.py")))


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    # torch's version and its vector code path (ATEN_CPU_CAPABILITY), which its own ops take
    digest = hashlib.blake2b(f"{torch.__version__} {torch.backends.cpu.get_cpu_capability()}".encode(), digest_size=6)
    here = Path(__file__).parent
    for name in FORWARD_CODE:
        try:
            digest.update((here / name).read_bytes())
        except OSError:  # an install without the file: its name stands in
            digest.update(name.encode())
    return digest.hexdigest()


def implementation(fmt: str) -> str:
    """`fmt`, the kernel that runs it here, the instruction set it was built for and a hash of the
    forward's code (FORWARD_CODE), as kept measurements (exactness, timings) are keyed: another
    kernel, ISA or code is measured again. Starts with `fmt-`."""
    from decoding.kernels import build as kernel_build

    return f"{fmt}-{kernel(fmt)}-{kernel_build.isa()}-{code_hash()}"


def build_kernels(say) -> None:
    """Build every kernel this CPU runs, at set-up (`draftwise models pull`), not while a user waits."""
    from decoding.kernels import build as kernel_build, row_ops

    for what, problem in (("attention", row_ops.problem), ("int8/int4", integer_linear.problem)):
        why = problem()
        say(f"kernel {what} for {kernel_build.isa()}: " + ("ready" if why is None else f"not used ({why})"))


def quantization_measured(fmt: str) -> bool:
    """Whether `fmt` here is the quantization the quality gate measured: int4's grids fitted per group
    (integer_linear.pack) exist only on the VNNI kernel; ATen's int4 packs min..max grids, never gated."""
    return fmt != "int4" or integer_linear.load()


def compute_dtype(fmt: str) -> torch.dtype:
    """The dtype of activations and of the KV cache under `fmt`. int4: fp32 where its own kernel runs
    (decoding/kernels/integer_linear.py, which quantizes activations to int8 itself), else bf16 for ATen's."""
    if fmt == "int4":
        return torch.float32 if integer_linear.load() else torch.bfloat16
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(fmt, torch.float32)


def load_dtype(fmt: str) -> torch.dtype:
    """The dtype to read the checkpoint in: quantized formats start from fp32."""
    return torch.float32 if fmt in QUANTIZED else compute_dtype(fmt)


def convert(model: nn.Module, fmt: str) -> nn.Module:
    """Turn a freshly loaded fp32 model into `fmt` in place (fp32 | bf16 | int8 | int4).

    Every nn.Linear is quantized, the lm_head too: with a 152k-token vocabulary it holds a quarter
    of a 0.5B model's weights, and each decode step reads all of it. Quantization reads the fp32
    weights, so every load of a format gives the same weights.
    """
    if fmt not in FORMATS + ("fp16",):
        raise ValueError(f"unknown weight format '{fmt}': use one of {', '.join(FORMATS)}")
    if fmt not in QUANTIZED:
        return model.to(compute_dtype(fmt))
    kept = 0
    embeddings = []
    quantized: dict[int, nn.Module] = {}  # id of a linear layer's weight -> its quantized layer
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                if fmt == "int4" and not _int4_fits(child):
                    kept += 1  # the kernel needs whole groups; such a layer stays in bf16
                    continue
                quantized[id(child.weight)] = (Int8Linear if fmt == "int8" else Int4Linear).from_linear(child)
                setattr(parent, name, quantized[id(child.weight)])
            elif isinstance(child, nn.Embedding):
                embeddings.append((parent, name, child))
    for parent, name, child in embeddings:  # after the linear layers: a tied lm_head is quantized by now
        if fmt == "int8":
            setattr(parent, name, Int8Embedding.from_embedding(child, quantized.get(id(child.weight))))
        else:
            setattr(parent, name, CompactEmbedding(child, compute_dtype(fmt)))
    if kept:
        log.info("%s: %d linear layers have shapes the int4 kernel cannot take; they stay bf16", fmt, kept)
    # The lm_head is a module of its own now (int8: sharing its buffers with a tied embedding); untie so
    # nothing ties their weights again.
    for cfg in (model.config, model.config.get_text_config()):
        if getattr(cfg, "tie_word_embeddings", False):
            cfg.tie_word_embeddings = False
    # Norms and int4's leftover layers take the compute dtype; the quantized modules keep theirs.
    # Copies, not views: a view of the memory-mapped checkpoint would keep all of it resident.
    for module in model.modules():
        if not isinstance(module, (Int8Linear, Int4Linear, Int8Embedding, CompactEmbedding)):
            for param in module.parameters(recurse=False):
                param.data = param.data.to(compute_dtype(fmt), copy=True)
    use_row_exact_attention(model)
    return_freed_memory()
    return model


def return_freed_memory() -> None:
    """Hand memory glibc keeps after frees back to the OS: quantizing frees ~2 GB of fp32 temporaries,
    and timing forwards at load frees their activations, in pieces glibc would otherwise keep."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def row_exact_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention for a verify forward computed one query row at a time, each row exactly the call a
    one-token decode step makes at that position (same kernel, same keys). Batched SDPA takes other
    code paths for k rows than for one (transformers packs GQA heads for single tokens), and its
    tiny differences would reach the next layer's int8 rounding."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rows = query.shape[2]
    if rows == 1 or rows >= ROW_EXACT_BELOW:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    past = key.shape[2] - rows
    out = [sdpa_attention_forward(module, query[:, :, i:i + 1], key[:, :, :past + i + 1],
                                  value[:, :, :past + i + 1], None, **kwargs)[0] for i in range(rows)]
    return torch.cat(out, dim=1), None


def use_row_exact_attention(model: nn.Module) -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ROW_EXACT_ATTENTION, row_exact_attention)
    AttentionMaskInterface.register(ROW_EXACT_ATTENTION, sdpa_mask)
    model.set_attn_implementation(ROW_EXACT_ATTENTION)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of weights the model holds (parameters and buffers, shared tensors once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def kernel_problem(fmt: str, device: torch.device, spec_text: str | None = None) -> str | None:
    """Why `fmt` cannot run on this device (for this model, when given), or None. Tries the kernel
    once on a tiny layer."""
    if fmt == GGUF:
        return _gguf_problem(device, spec_text)
    if fmt not in QUANTIZED:
        return None
    if device.type != "cpu":
        return f"{fmt} weights use CPU kernels here; this device is {device.type}"
    if not integer_linear.load() and not int_mm_exact():  # both formats' lm_head is int8
        return (f"{fmt} needs draftwise's int8 kernel on this CPU ({integer_linear.problem()}): torch's int8 "
                "matmul saturates its sums here (oneDNN without VNNI)")
    try:
        if kernel(fmt).startswith("q4q8"):
            layer = integer_linear.Q4Linear(nn.Linear(128, 32).weight, None, keep=False)
        else:
            layer = (Int8Linear if fmt == "int8" else Int4Linear).from_linear(nn.Linear(128, 32))
        layer(torch.randn(2, 128, dtype=compute_dtype(fmt)))
    except Exception as exc:  # noqa: BLE001 - a missing or broken kernel is one log line, not a crash
        return f"the {fmt} kernel does not run in torch {torch.__version__}: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


@functools.lru_cache(maxsize=1)
def int_mm_exact() -> bool:
    """Whether `torch._int_mm` sums int8 products exactly on this CPU. oneDNN without VNNI multiplies
    with `vpmaddubsw`, whose int16 pair sums saturate: 127 x 127 rows came out tens of thousands off.
    Where it passes, its sums are integers in any order, and int8 on it is exact by construction."""
    b = torch.full((896, 16), 127, dtype=torch.int8)
    b[:, 8:] = -127
    # oneDNN picks kernels by shape: every row count a step or a verify forward has, and a chunk's
    for rows in (*range(1, 18), 64, 256):
        a = torch.full((rows, 896), 127, dtype=torch.int8)
        a[:, ::3] = -127
        if not torch.equal(torch._int_mm(a, b), a.int() @ b.int()):
            return False
    return True


def _gguf_problem(device: torch.device, spec_text: str | None) -> str | None:
    from decoding.models import llamacpp_model
    from decoding.models.pack import gguf_file

    if device.type != "cpu":
        return f"gguf weights run on llama.cpp's CPU build here; this device is {device.type}"
    if not llamacpp_model.available():
        return "gguf weights need llama.cpp: pip install 'draftwise[llamacpp]'"
    if spec_text is not None and gguf_file(spec_text) is None:
        return f"no GGUF file for {spec_text} (a preset's comes with `draftwise models pull`)"
    return None
