"""The target's forward written for fixed shapes (gpt-fast style), so that every row it computes is
exactly the row a one-token step computes, at any number of rows and of threads.

A forward takes `n` token ids at consecutive positions from `start` and appends their keys and
values to the cache. Its cost has three parts: the linear layers (the weights read once per
forward), attention (compute that grows with `n` times the keys read), and a few hundred small
element-wise ops.

Why each row is exact, whatever `n`, the thread count and however the sequence was split into
forwards:
- the linear layers compute each row on its own (int8: integer products of a row quantized with
  its own scale; int4: decoding/kernels/integer_linear.py's kernel, the same per row, or ATen's, which
  runs rows independently);
- attention: decoding/kernels/row_ops.cpp computes each (row, head) as one task in an order of its
  own, over exactly the keys at positions 0..p. Where it cannot run (no C++ compiler, bf16
  activations), torch's batched matmuls on one thread, a row at position p attending over a window
  of keys that depends on p alone (the first roundup(p + 1, WINDOW_STEP) cache positions, later ones
  masked): a longer window would change how the row's sums are split even where its extra keys are
  masked, so rows of one forward whose windows differ are computed in one batched matmul per window;
- SiLU runs on few enough rows per call that ATen keeps each call on one thread (row_ops.silu);
  norms and softmax reduce along a row.
So the cache a prompt leaves is the same bit for bit whether it was read at once, in chunks or one
token at a time, and a verify row is a decode step. The exactness probe (decoding/runners/
exactness.py) checks the kernels keep that promise on the device; tests/engine/test_row_invariance.py
at 1 to 16 threads.

Supported: Llama-family decoders (Qwen2, Llama, Mistral) with plain rotary embeddings. Others run
on transformers' own forward (decoding/runners/hf.py).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from decoding.kernels import integer_linear, row_ops
from decoding.models.weights import Int4Linear, Int8Embedding, Int8Linear, compute_dtype, int4_groups, int8_rows

ARCHITECTURES = ("qwen2", "llama", "mistral")
# int4 group size along the input dimension: with ATen's CPU kernel, smaller groups cost a little more
# for one row and less for the few rows speculation verifies (docs/history.md), and quantize more finely.
INT4_GROUP = 32
# Attention windows grow in steps of this many positions: a step costs a row at most this many masked
# keys, and a forward of up to this many rows spans at most two windows.
WINDOW_STEP = 128
# Positions the KV buffer holds at first (the default prompt budget, generation and a draft fit);
# it grows when a longer sequence comes.
STATIC_CONTEXT = 2048


def unsupported(config, max_len: int) -> str | None:
    """Why this model cannot run on the static forward, or None."""
    text = config.get_text_config()
    if text.model_type not in ARCHITECTURES:
        return f"architecture {text.model_type} (the static forward knows {', '.join(ARCHITECTURES)})"
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return f"rotary scaling {rope.get('rope_type', rope.get('type'))}"
    if getattr(text, "hidden_act", "silu") != "silu":
        return f"activation {text.hidden_act}"
    window = getattr(text, "sliding_window", None)
    if window and getattr(text, "use_sliding_window", text.model_type == "mistral") and window < max_len:
        return f"a sliding window of {window} tokens"
    if getattr(text, "mlp_bias", False):
        return "biases in the MLP"
    return None


# Attention matmuls get at least this many rows: BLAS computes a matrix of one or two rows with
# other kernels than a taller one (seen with fp32 and 2 query heads per key head), which would make
# a one-token step differ from the same row in a verify forward. Padding rows cost next to nothing.
MIN_ATTENTION_ROWS = 8


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    rows = a.shape[1]
    if rows >= MIN_ATTENTION_ROWS:
        return torch.bmm(a, b)
    return torch.bmm(F.pad(a, (0, 0, 0, MIN_ATTENTION_ROWS - rows)), b)[:, :rows]


class Dense(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__()
        self.register_buffer("weight", weight.detach().to(dtype).clone())
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias)


def _linear(fmt: str, weights: list[torch.Tensor], biases: list[torch.Tensor | None]) -> nn.Module:
    """One layer computing several projections of the same input (their outputs side by side): one
    weight read and one activation quantization instead of several."""
    if weights[0].is_meta:  # a layout, filled from a kept file (decoding/models/quantized_store.py)
        weight = torch.empty(sum(w.shape[0] for w in weights), weights[0].shape[1], device="meta")
        bias = torch.empty(weight.shape[0], device="meta") if any(b is not None for b in biases) else None
    else:
        weight = torch.cat([w.detach().float() for w in weights])
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat([b.detach().float() if b is not None else torch.zeros(w.shape[0])
                              for w, b in zip(weights, biases)])
    # int8 computes each row with its own scale and sums integers; the int4 kernel runs rows on
    # their own: a row's result never depends on the other rows
    if fmt == "int8":
        return Int8Linear(*int8_rows(weight), bias)
    out_features, in_features = weight.shape
    if fmt == "int4" and integer_linear.load() and integer_linear.fits(out_features, in_features):
        return integer_linear.Q4Linear(weight, bias)
    if fmt == "int4" and integer_linear.load() and in_features % 4 == 0:
        # a shape the int4 kernel does not take: int8 on draftwise's kernel, exact as the rest of the
        # forward is (ATen's int4 kernel and F.linear are not row-exact by construction)
        return Int8Linear(*int8_rows(weight), bias)
    if fmt == "int4" and out_features % 8 == 0 and in_features % INT4_GROUP == 0:
        return Int4Linear(*int4_groups(weight, INT4_GROUP), INT4_GROUP, in_features, out_features,
                          None if bias is None else bias.to(torch.bfloat16))
    return Dense(weight, bias, compute_dtype(fmt))


class Block(nn.Module):
    def __init__(self, layer, fmt: str, dtype: torch.dtype):
        super().__init__()
        a, m = layer.self_attn, layer.mlp
        self.qkv = _linear(fmt, [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight],
                           [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
        self.o = _linear(fmt, [a.o_proj.weight], [a.o_proj.bias])
        self.gate_up = _linear(fmt, [m.gate_proj.weight, m.up_proj.weight], [None, None])
        self.down = _linear(fmt, [m.down_proj.weight], [None])
        self.register_buffer("norm1", layer.input_layernorm.weight.detach().to(dtype).clone())
        self.register_buffer("norm2", layer.post_attention_layernorm.weight.detach().to(dtype).clone())


class StaticDecoder(nn.Module):
    """A Llama-family decoder with its KV cache in place, built from a transformers model's weights
    in a format (int8, int4; the float formats work too, for tests and comparisons)."""

    static_forward = True  # decoding.runners.runner_for: run it on StaticRunner

    def __init__(self, hf_model, fmt: str, max_len: int):
        super().__init__()
        cfg = hf_model.config.get_text_config()
        self.config = hf_model.config
        self.format, self.dtype = fmt, compute_dtype(fmt)
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.group = self.heads // self.kv_heads
        self.eps = cfg.rms_norm_eps
        self.vocab_size = cfg.vocab_size
        inner = hf_model.model
        self.blocks = nn.ModuleList(Block(layer, fmt, self.dtype) for layer in inner.layers)
        self.register_buffer("norm", inner.norm.weight.detach().to(self.dtype).clone())
        # The lm_head reads a quarter of a 0.5B model's bytes each step: int8 for both quantized formats.
        head = hf_model.lm_head.weight
        self.lm_head = _linear("int8" if fmt in ("int8", "int4") else fmt, [head], [hf_model.lm_head.bias])
        # The embedding: int8 rows with a scale each for the quantized formats (as many bytes as the
        # lm_head, one row read per token), the lm_head's own buffers where the checkpoint ties them
        table = inner.embed_tokens.weight
        if isinstance(self.lm_head, Int8Linear):
            # the same Parameter where transformers ties them (its data pointer: a checkpoint that
            # stores one matrix for both); built on the meta device, only the former says anything
            same = head is table or (not head.is_meta and head.data_ptr() == table.data_ptr())
            tied = same and self.lm_head.bias is None
            self.embed = Int8Embedding(self.lm_head.qweight, self.lm_head.scale) if tied else \
                Int8Embedding(*int8_rows(table))
        else:
            self.embed = nn.Embedding.from_pretrained(table.detach().to(self.dtype).clone())
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        self.rope_theta = float(theta)
        # attention by row_ops.cpp where it builds (fp32 activations: int8, int4 on its kernel)
        self.attention_kernel = row_ops.attention_kernel(self.dtype, self.head_dim)
        self.max_len = 0
        self.resize(-(-max_len // WINDOW_STEP) * WINDOW_STEP)

    def resize(self, max_len: int) -> None:
        """(Re)allocate the KV cache and rotary tables for positions 0..max_len-1 (forgets the cache)."""
        shape = (len(self.blocks), self.kv_heads, max_len, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=self.dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=self.dtype), persistent=False)
        # transformers' default rotary embedding, computed the same way (fp32, then the compute dtype)
        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim))
        freqs = torch.arange(max_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
        angles = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", angles.cos().to(self.dtype), persistent=False)
        self.register_buffer("sin", angles.sin().to(self.dtype), persistent=False)
        self.max_len = max_len

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * len(self.blocks) * self.kv_heads * self.head_dim * self.k_cache.element_size()

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    @staticmethod
    def window_groups(start: int, n: int) -> list[tuple[int, int, int]]:
        """Rows start..start+n-1 as (first row, end row, window) runs of equal window."""
        groups, row = [], 0
        while row < n:
            window = ((start + row) // WINDOW_STEP + 1) * WINDOW_STEP
            end = min(n, window - start)
            groups.append((row, end, window))
            row = end
        return groups

    def grow(self, length: int) -> None:
        """Make room for `length` positions, keeping the cache's contents."""
        if length <= self.max_len:
            return
        keep_k, keep_v = self.k_cache, self.v_cache
        self.resize(-(-max(length, self.max_len * 3 // 2) // WINDOW_STEP) * WINDOW_STEP)
        self.k_cache[:, :, :keep_k.shape[2]] = keep_k
        self.v_cache[:, :, :keep_v.shape[2]] = keep_v

    def forward(self, ids: torch.Tensor, start: int, keep: int) -> torch.Tensor:
        """Append ids' keys and values at positions start.. and return the float32 logits of the
        last `keep` rows [keep, V]."""
        n = ids.shape[0]
        self.grow(start + n)
        x = self.embed(ids).to(self.dtype)
        cos, sin = self.cos[start:start + n].unsqueeze(1), self.sin[start:start + n].unsqueeze(1)
        if self.attention_kernel:
            for i, block in enumerate(self.blocks):
                q, k, v = self.queries_keys_values(block, x, cos, sin)
                self.k_cache[i, :, start:start + n] = k
                self.v_cache[i, :, start:start + n] = v
                x = self.after_attention(block, x, row_ops.causal_attention(q, self.k_cache[i], self.v_cache[i], start))
            return self.logits(x[n - keep:])
        pos = torch.arange(start, start + n)
        groups = self.window_groups(start, n)
        masks = [self.visible(pos[a:b], w) for a, b, w in groups]
        for i, block in enumerate(self.blocks):
            rows, k, v = self.attention_inputs(block, x, cos, sin)
            self.k_cache[i, :, start:start + n] = k
            self.v_cache[i, :, start:start + n] = v
            with row_ops.one_thread():
                parts = [self.attend(rows[:, :, a:b], self.k_cache[i, :, :w], self.v_cache[i, :, :w], visible)
                         for (a, b, w), visible in zip(groups, masks)]
            x = self.after_attention(block, x, self.merge_heads(parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)))
        return self.logits(x[n - keep:])

    def visible(self, pos: torch.Tensor, window: int) -> torch.Tensor:
        """Which of a window's keys rows at positions `pos` see, per query head of a group: [1, g * n, window]."""
        n = pos.shape[0]
        return (torch.arange(window).unsqueeze(0) <= pos.unsqueeze(1)).unsqueeze(0).expand(self.group, n, window) \
            .reshape(1, self.group * n, window)

    # One layer in parts: the attention kernel's path and torch's share all but attention.
    def queries_keys_values(self, block: Block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """The rows' queries, rotated and scaled: [n, h, d]; their keys and values as the cache holds
        them: [kvh, n, d]."""
        n = x.shape[0]
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        qkv = block.qkv(self._norm(x, block.norm1)).to(self.dtype)
        q = self._rotate(qkv[:, :h * d].view(n, h, d), cos, sin) * d ** -0.5
        k = self._rotate(qkv[:, h * d:(h + kvh) * d].view(n, kvh, d), cos, sin)
        v = qkv[:, (h + kvh) * d:].view(n, kvh, d)
        return q, k.transpose(0, 1), v.transpose(0, 1)

    def attention_inputs(self, block: Block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """queries_keys_values with the queries grouped per key/value head as (group member, token):
        [kvh, g, n, d], for the batched matmuls of `attend`."""
        q, k, v = self.queries_keys_values(block, x, cos, sin)
        return q.view(q.shape[0], self.kv_heads, self.group, self.head_dim).permute(1, 2, 0, 3), k, v

    def merge_heads(self, attended: torch.Tensor) -> torch.Tensor:
        """attend's [kvh, g, n, d] as the output projection takes it: [n, h * d]."""
        return attended.permute(2, 0, 1, 3).reshape(attended.shape[2], self.heads * self.head_dim)

    def attend(self, rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor):
        """rows [kvh, g, m, d] over one window's keys and values [kvh, w, d]: [kvh, g, m, d]."""
        kvh, g, m, d = rows.shape
        scores = _bmm(rows.reshape(kvh, g * m, d), keys.transpose(1, 2))
        probs = torch.softmax(scores.float().masked_fill(~visible, float("-inf")), dim=-1).to(self.dtype)
        return _bmm(probs, values).view(kvh, g, m, d)

    def after_attention(self, block: Block, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The rest of a layer, from the heads' outputs [n, h * d]."""
        x = x + block.o(attended).to(self.dtype)
        gate_up = block.gate_up(self._norm(x, block.norm2))
        half = gate_up.shape[1] // 2
        return x + block.down((row_ops.silu(gate_up[:, :half]) * gate_up[:, half:]).to(self.dtype)).to(self.dtype)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        # float logits from the int8 lm_head in both quantized formats (it returns its input's dtype)
        return self.lm_head(self._norm(x, self.norm).float()).float()
