"""Quantized models kept on disk: a second start reads the int8 / int4 static forward's buffers from
one safetensors file instead of reading the fp32 checkpoint and quantizing it again (for the 0.5B:
~2 GB read and seconds of rounding against ~0.5 GB read).

A file is named by the model's files (path, sizes, times), the format and `weights.implementation`
(kernel, instruction set, a hash of the forward's code): other weights or other code never read it.
Writing it is atomic, and a disk too full to take it costs the next start its quantizing, nothing
more; a file that cannot be read is deleted and made again. Files beyond 6 GB go least recently used
first, those of a checkpoint that is gone, and those of other code unused for a week
(decoding/home/cache_files.py).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
from pathlib import Path

import torch

from decoding.home import cache_files, paths

log = logging.getLogger(__name__)

DIR = "quantized"
KEPT_BYTES = 6 << 30  # the 1.5B and the 0.5B in both formats, with room to spare


def _checkpoint_id(source: str) -> str:
    """The checkpoint's identity: its safetensors files' paths, sizes and times (a re-pull or an edit
    changes it)."""
    files = sorted(Path(source).glob("*.safetensors")) + sorted(Path(source).glob("config.json"))
    described = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return hashlib.blake2b(json.dumps(described).encode(), digest_size=8).hexdigest()


def path_for(source: str, fmt: str) -> Path | None:
    """Where this checkpoint in `fmt` is (to be) kept, or None when its files cannot be read."""
    from decoding.kernels import integer_linear
    from decoding.models.weights import code_hash, implementation

    if fmt == "int4" and not integer_linear.load():  # ATen's packing is made at load; only our kernel's is kept
        return None
    if not Path(source).is_dir() or not any(Path(source).glob("*.safetensors")):
        return None  # a hub id not downloaded yet: no files to name it by
    try:
        model = _checkpoint_id(source)
    except OSError:
        return None
    cache_files.housekeeping(paths.draftwise_home(), integer_linear.pack_code(), code_hash())
    where = paths.draftwise_home() / DIR / f"{model}-{implementation(fmt)}.safetensors"
    _sources[where] = str(Path(source).resolve())
    return where


_sources: dict[Path, str] = {}  # kept file -> its checkpoint's folder: noted in the file (housekeeping)


def save(decoder, where: Path) -> None:
    """Keep the decoder's buffers (a tied embedding's once, with a note of what it shares). Its int4
    layers' packings, kept until now (decoding/kernels/integer_linear.py), are in it from then on:
    they are removed."""
    state, shared, seen = {}, {}, {}
    for name, tensor in decoder.state_dict().items():
        if tensor is None:
            continue
        key = (tensor.data_ptr(), tensor.shape, tensor.dtype)
        if key in seen:
            shared[name] = seen[key]
            continue
        seen[key] = name
        state[name] = tensor.contiguous()
    with contextlib.suppress(*cache_files.tensor_errors()):
        if set(mapped(where)[0]) == set(state):  # kept meanwhile by another start of the same model
            return
    try:
        # the checkpoint it was made from: once that is gone, housekeeping removes the file
        metadata = {"shared": json.dumps(shared), "source": _sources.get(where, "")}
        cache_files.write_tensors(where, state, metadata=metadata)
    except OSError as exc:
        cache_files.could_not_keep("the quantized model", where.parent, exc, "the next start quantizes it again")
        return
    log.info("quantized model kept in %s", where)
    for module in decoder.modules():
        if (packed := getattr(module, "packed_file", None)) is not None:
            with contextlib.suppress(OSError):
                packed.unlink()
    # other implementations' files stay (another ISA path may be forced again) until they are the
    # least recently used
    paths.evict_least_recently_used(where.parent, KEPT_BYTES)


DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I8": torch.int8,
          "U8": torch.uint8, "I32": torch.int32, "I64": torch.int64}


def mapped(where: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A safetensors file's tensors as views of the file mapped into memory (copy-on-write: shared with
    the page cache, never written back), and its metadata. No copy: a start reads nothing it does not
    compute with, and two servers share the pages. ValueError for a file that is not whole."""
    import mmap

    with open(where, "rb") as f:
        length = os.fstat(f.fileno()).st_size
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size <= length - 8:
            raise ValueError("a header size past the file's end")
        header = json.loads(f.read(size))
        if not isinstance(header, dict):
            raise ValueError("a header that is not a table")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = DTYPES[entry["dtype"]]
        count, offset = (end - begin) // dtype.itemsize, 8 + size + begin
        if (not 0 <= begin <= end or offset + (end - begin) > length or (end - begin) % dtype.itemsize
                or offset % dtype.itemsize or count != math.prod(entry["shape"])):
            raise ValueError(f"{name} lies outside the file, is misaligned or does not fill its shape")
        tensors[name] = (torch.frombuffer(data, dtype=dtype, count=count, offset=offset).view(entry["shape"])
                         if count else torch.empty(entry["shape"], dtype=dtype))
    return tensors, metadata


def load(decoder, where: Path) -> bool:
    """Fill a decoder built on the meta device from the kept file; False when there is none, or it is
    torn or does not fit (deleted: the caller quantizes again and keeps a new one)."""
    try:
        seen = where.stat()
        state, metadata = mapped(where)
        shared = json.loads(metadata.get("shared", "{}"))
    except FileNotFoundError:  # evicted since it was looked for
        return False
    except (*cache_files.tensor_errors(), AttributeError) as exc:
        cache_files.unreadable("kept quantized model", where, exc, "quantizing again")
        cache_files.discard(where, seen)
        return False
    try:
        for name, original in shared.items():
            state[name] = state[original]
        decoder.load_state_dict(state, strict=True, assign=True)
    except (RuntimeError, KeyError, TypeError, AttributeError) as exc:
        cache_files.unreadable("kept quantized model", where, exc, "quantizing again")
        cache_files.discard(where, seen)
        return False
    cache_files.touch(where)
    return True


def meta_skeleton(config):
    """The parts of a transformers Llama-family model StaticDecoder reads (`model.layers[i].self_attn.
    q_proj.weight`, ...), as weightless meta tensors of the checkpoint's shapes. Not transformers'
    own modules: importing a model's module costs ~1.5 s a start, and only shapes are needed. A
    layout that differs from the kept file's (a bias more or less) fails load(), which then
    quantizes from the checkpoint."""
    from types import SimpleNamespace as Node

    text = config.get_text_config()
    hidden, heads, kv_heads = text.hidden_size, text.num_attention_heads, text.num_key_value_heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    qkv_bias = text.model_type == "qwen2" or bool(getattr(text, "attention_bias", False))
    o_bias = text.model_type != "qwen2" and bool(getattr(text, "attention_bias", False))

    def linear(out_features: int, in_features: int, bias: bool):
        return Node(weight=torch.empty(out_features, in_features, device="meta"),
                    bias=torch.empty(out_features, device="meta") if bias else None)

    def vector(n: int):
        return Node(weight=torch.empty(n, device="meta"))

    def layer():
        attention = Node(q_proj=linear(heads * head_dim, hidden, qkv_bias), k_proj=linear(kv_heads * head_dim, hidden, qkv_bias),
                         v_proj=linear(kv_heads * head_dim, hidden, qkv_bias), o_proj=linear(hidden, heads * head_dim, o_bias))
        mlp = Node(gate_proj=linear(text.intermediate_size, hidden, False), up_proj=linear(text.intermediate_size, hidden, False),
                   down_proj=linear(hidden, text.intermediate_size, False))
        return Node(self_attn=attention, mlp=mlp, input_layernorm=vector(hidden), post_attention_layernorm=vector(hidden))

    embed = Node(weight=torch.empty(text.vocab_size, hidden, device="meta"))
    head = Node(weight=embed.weight if getattr(config, "tie_word_embeddings", False) else
                torch.empty(text.vocab_size, hidden, device="meta"), bias=None)
    inner = Node(layers=[layer() for _ in range(text.num_hidden_layers)], norm=vector(hidden), embed_tokens=embed)
    return Node(config=config, model=inner, lm_head=head)
