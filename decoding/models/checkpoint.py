"""Load a model named by a spec: safetensors only, trust_remote_code off unless asked."""
from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from decoding.errors import ModelLoadError, ModelNotAvailable, ModelSpecError
from decoding.models import pack
from decoding.models.pack import gguf_file  # noqa: F401  (where callers found it before)
from decoding.models.specs import PRESETS, ModelSpec, parse_model_spec

log = logging.getLogger(__name__)

HUB_HOST = "huggingface.co"
# llama.cpp's context for the gguf format, at least: the default prompt budget plus generation and
# drafts, with room to spare (~12 KB a token for the 0.5B, ~28 KB for the 1.5B). A larger configured
# budget gets a larger context; a request asking for more than the context holds is fitted to it.
GGUF_CONTEXT_TOKENS = 4096


@dataclass
class LoadedModel:
    model: Any  # a transformers PreTrainedModel in eval mode
    tokenizer: Any  # a PreTrainedTokenizerFast
    spec: ModelSpec
    device: Any  # torch.device
    dtype: Any  # torch.dtype of activations and the KV cache
    name: str  # what to show users
    weights: str = "fp32"  # weight format (decoding.models.weights)


def resolve_device(device: str = "auto", dtype: str = "auto"):
    """auto: CUDA in bf16, else Apple MPS in fp16, else CPU in fp32 (bf16 on CPU is ~6x slower)."""
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            device = "cuda"
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            device = "mps"
        else:
            device = "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ModelSpecError(f"unknown device '{device}': use auto, cpu, cuda, cuda:N or mps") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelSpecError("device 'cuda' was asked for but no CUDA GPU is visible to torch")
    if dtype == "auto":
        dtype = {"cuda": "bfloat16", "mps": "float16"}.get(dev.type, "float32")
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise ModelSpecError(f"unknown dtype '{dtype}': use auto, float32, bfloat16 or float16")
    return dev, names[dtype]


def device_key(device) -> str:
    import platform

    import torch

    if device.type != "cpu":
        return str(device)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return (f"cpu {cpu} / {torch.backends.cpu.get_cpu_capability()} / torch {torch.__version__} / "
            f"{torch.get_num_threads()} threads")


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True"):
        return False
    endpoint = os.environ.get("HF_ENDPOINT", "https://" + HUB_HOST).split("://", 1)[-1].split("/", 1)[0]
    host, _, port = endpoint.partition(":")
    try:
        with socket.create_connection((host, int(port or 443)), timeout=timeout):
            return True
    except OSError:
        return False


def checkpoint_bytes(spec_text: str) -> int:
    """The size of a local checkpoint's weight files (0 where there are none here: a hub id, a remote)."""
    from decoding.models.specs import parse_model_spec

    try:
        spec = parse_model_spec(spec_text)
        if spec.kind == "gguf":
            return Path(spec.value).stat().st_size
        if spec.kind not in ("preset", "hf_dir"):  # a hub id: weighing it could start a download
            return 0
        folder = Path(model_source(spec)[0])
        return sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    except Exception:  # noqa: BLE001 - not pulled, unreadable: nothing to weigh
        return 0


def model_source(spec: ModelSpec) -> tuple[str, dict]:
    """Where from_pretrained should read, and the extra arguments it needs."""
    if spec.kind == "preset":
        if not pack.is_pulled(spec.preset):
            raise ModelNotAvailable(
                f"model '{spec.value}' is not pulled yet: run `draftwise models pull {spec.value}`"
            )
        return str(pack.preset_dir(spec.preset)), {}
    if spec.kind == "hf_dir":
        if not list(Path(spec.value).glob("*.safetensors")):
            raise ModelLoadError(
                f"{spec.value} has no .safetensors weights; draftwise never loads pickle (.bin/.pt) weights"
            )
        return spec.value, {}
    if spec.kind == "gguf":
        from transformers import GgufConfig

        p = Path(spec.value)
        return str(p.parent), {"gguf_file": p.name, "quantization_config": GgufConfig(dequantize=True)}
    # hub id: the local hub cache first, then the network, failing fast when it is unreachable
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(spec.value, local_files_only=True, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]), {}
    except Exception:
        pass
    if not _hub_reachable():
        raise ModelNotAvailable(
            f"cannot reach the model hub to fetch '{spec.value}'; offline presets: {', '.join(PRESETS)} "
            "(`draftwise models pull`)"
        )
    return spec.value, {}


def load_model(spec_text: str, device: str = "auto", dtype: str = "auto", trust_remote_code: bool = False,
               role: str = "target", weights: str | None = None, context_tokens: int = GGUF_CONTEXT_TOKENS) -> LoadedModel:
    """weights: a format of decoding.models.weights (fp32, bf16, int8, int4, gguf); None: `dtype` decides.
    context_tokens: positions llama.cpp's context holds (gguf); prompts are fitted to it."""
    import torch

    from decoding import faults
    from decoding.models import weights as formats

    if role == "target" and faults.trip("target_load_oom"):
        raise ModelLoadError(f"out of memory while loading '{spec_text}' (injected fault)")
    if role == "draft" and faults.trip("draft_load_error"):
        raise ModelLoadError(f"could not load '{spec_text}': injected fault")
    spec = parse_model_spec(spec_text)
    dev, torch_dtype = resolve_device(device, dtype)
    if weights is not None:
        if problem := formats.kernel_problem(weights, dev, spec_text):
            raise ModelSpecError(problem)
        if weights == formats.GGUF:
            return _load_gguf(spec_text, spec, dev, trust_remote_code, context_tokens)
        # quantized formats read the fp32 weights, so every load of a format gives the same model
        torch_dtype = formats.load_dtype(weights)
    source, extra = model_source(spec)
    try:
        # the tokenizer (~0.3 s parsing its JSON) is read while a kept quantized model maps: a start
        # that finds both needs nothing of transformers. Where transformers builds the tokenizer, its
        # lazy module is resolved here first, not in both threads at once.
        if not _tokenizer_kept(source, extra, trust_remote_code):
            from transformers import AutoTokenizer  # noqa: F401
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            reading = pool.submit(_tokenizer, source, extra, trust_remote_code)
            kept = (_kept_static_decoder(source, weights, trust_remote_code)
                    if weights in formats.QUANTIZED and dev.type == "cpu" and not extra else None)
            tokenizer = reading.result()
        if kept is not None:
            return LoadedModel(kept, tokenizer, spec, dev, formats.compute_dtype(weights), _display_name(spec), weights)
        model = _checkpoint(source, extra, torch_dtype, trust_remote_code)
    except Exception as exc:  # corrupted files surface as many types (SafetensorError, OSError, ...)
        raise _load_error(spec_text, exc, trust_remote_code) from exc
    model.to(dev).eval()
    if weights in formats.QUANTIZED:
        model = _quantized(model, weights, dev, None if extra else source)
        torch_dtype = formats.compute_dtype(weights)
    name = _display_name(spec)
    fmt = weights or {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[torch_dtype]
    return LoadedModel(model, tokenizer, spec, dev, torch_dtype, name, fmt)


def _checkpoint(source: str, extra: dict, torch_dtype, trust_remote_code: bool):
    """transformers' model from the checkpoint (safetensors only, or the GGUF file it converts)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, trust_remote_code=trust_remote_code,
                                                use_safetensors=None if "gguf_file" in extra else True, **extra)


def _load_error(spec_text: str, exc: Exception, trust_remote_code: bool) -> ModelLoadError:
    """What went wrong reading a checkpoint, said for the user."""
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return ModelLoadError(f"out of GPU memory while loading '{spec_text}'; try a smaller model or --device cpu")
    if isinstance(exc, MemoryError):
        return ModelLoadError(f"out of memory while loading '{spec_text}'")
    if not trust_remote_code and "trust_remote_code" in str(exc):
        return ModelLoadError(
            f"'{spec_text}' needs to run code that ships with the model, which is off by default. Only "
            "if you trust its author: start the server with --trust-remote-code (the setting cannot "
            "be changed from the editor)")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ModelLoadError(f"could not load '{spec_text}': {first}")


def _kept_static_decoder(source: str, fmt: str, trust_remote_code: bool):
    """The static forward in `fmt` from the quantized model kept on disk (decoding/models/
    quantized_store.py), or None: none kept, or an architecture the static forward does not take."""
    from decoding.models import quantized_store
    from decoding.models.static_decoder import STATIC_CONTEXT, StaticDecoder, unsupported

    where = quantized_store.path_for(source, fmt)
    if where is None or not where.exists():
        return None
    try:
        config = _plain_config(source, trust_remote_code)
        if unsupported(config, STATIC_CONTEXT):
            return None
        decoder = StaticDecoder(quantized_store.meta_skeleton(config), fmt, STATIC_CONTEXT)
    except Exception as exc:  # noqa: BLE001 - the checkpoint path still loads: quantize again
        log.warning("kept %s model %s not used (%s: %s): quantizing again", fmt, where.name, type(exc).__name__, exc)
        return None
    if not quantized_store.load(decoder, where):
        return None
    log.info("%s weights read from %s", fmt, where)
    return decoder


def timing_stand_in(spec_text: str, fmt: str, device, trust_remote_code: bool = False) -> LoadedModel | None:
    """The model in `fmt` on the static forward with its checkpoint's shapes and zeros for weights, to
    time, or None (a format or architecture the static forward does not run: time the real one). A
    forward's time does not depend on its weights' values: the kernels have no data-dependent path.
    So a start times a format without reading the checkpoint or quantizing it, and quantizes only the
    one it serves (a first start of the 1.5B fitted both formats' grids: 30 s of its 147)."""
    import torch

    from decoding.models import quantized_store
    from decoding.models import weights as formats
    from decoding.models.static_decoder import STATIC_CONTEXT, StaticDecoder, unsupported

    spec = parse_model_spec(spec_text)
    if fmt not in formats.QUANTIZED or device.type != "cpu":
        return None
    source, extra = model_source(spec)
    if extra:
        return None
    config = _plain_config(source, trust_remote_code)
    if unsupported(config, STATIC_CONTEXT):
        return None
    decoder = StaticDecoder(quantized_store.meta_skeleton(config), fmt, STATIC_CONTEXT).to_empty(device=device)
    with torch.no_grad():
        for tensor in [*decoder.parameters(), *decoder.buffers()]:
            tensor.zero_()
    return LoadedModel(decoder, None, spec, device, formats.compute_dtype(fmt), _display_name(spec), fmt)


def _quantized(model, fmt: str, device, source: str | None = None):
    """int8 / int4: the static-shape forward where it knows the architecture (exact at every verify
    width, without transformers' per-layer Python), else transformers' model with its linear
    layers swapped for quantized ones. The static forward's buffers are kept for the next start
    (source: the checkpoint's directory)."""
    from decoding.models import quantized_store
    from decoding.models import weights as formats
    from decoding.models.static_decoder import STATIC_CONTEXT, StaticDecoder, unsupported

    why = unsupported(model.config, STATIC_CONTEXT) if device.type == "cpu" else f"device {device.type}"
    if why is None:
        decoder = StaticDecoder(model, fmt, STATIC_CONTEXT)
        del model
        formats.return_freed_memory()
        where = quantized_store.path_for(source, fmt) if source else None
        if where is not None:
            quantized_store.save(decoder, where)
        return decoder
    log.info("%s weights on transformers' forward: the static forward does not take %s", fmt, why)
    return formats.convert(model, fmt)


def _load_gguf(spec_text: str, spec: ModelSpec, device, trust_remote_code: bool, context_tokens: int) -> LoadedModel:
    """The `gguf` format: llama.cpp runs the GGUF file; the tokenizer is the model's own (the same
    vocabulary: a preset's safetensors and tokenizer were made from that file)."""
    import torch

    from decoding.models.llamacpp_model import LlamaCppModel

    tokenizer = _tokenizer(*model_source(spec), trust_remote_code)
    model = LlamaCppModel(gguf_file(spec_text), max(GGUF_CONTEXT_TOKENS, context_tokens))
    if model.vocab_size < len(tokenizer):
        model.close()
        raise ModelLoadError(f"{model.path.name} has {model.vocab_size} tokens, its tokenizer {len(tokenizer)}")
    return LoadedModel(model, tokenizer, spec, device, torch.float32, _display_name(spec), "gguf")


# what the static forward reads of a configuration without a default of its own
STATIC_FIELDS = frozenset({"model_type", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                           "num_hidden_layers", "rms_norm_eps", "vocab_size", "hidden_act"})


class _JsonConfig(SimpleNamespace):
    """config.json's fields as attributes: all the static forward reads of a model's configuration
    (decoding/models/static_decoder.py, quantized_store.meta_skeleton). A field the file lacks is
    absent here where transformers would fill its default; the readers give the same defaults."""

    def get_text_config(self):
        return self


def _plain_config(source: str, trust_remote_code: bool):
    """The configuration without importing transformers (~0.8 s of a start) where config.json says
    all of it: a text-only model with no code of its own; else transformers' AutoConfig."""
    try:
        data = json.loads((Path(source) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if isinstance(data, dict) and "text_config" not in data and "auto_map" not in data and STATIC_FIELDS <= set(data):
        return _JsonConfig(**data)
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)


def _tokenizer_kept(source: str, extra: dict, trust_remote_code: bool) -> bool:
    from decoding.models.tokenizer import kept_path

    where = kept_path(source) if "gguf_file" not in extra and not trust_remote_code else None
    return where is not None and where.is_file()


def _tokenizer(source: str, extra: dict, trust_remote_code: bool):
    """The model's tokenizer: as transformers built it at an earlier start, kept (decoding/models/
    tokenizer.py), else transformers' AutoTokenizer, kept for the next start."""
    from decoding.models.tokenizer import FileTokenizer

    plain = "gguf_file" not in extra and not trust_remote_code
    if plain and (tokenizer := FileTokenizer.read(source)) is not None:
        return tokenizer
    from transformers import AutoTokenizer

    tok_extra = {"gguf_file": extra["gguf_file"]} if "gguf_file" in extra else {}
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code, **tok_extra)
    if plain:
        FileTokenizer.keep(source, tokenizer)
    return tokenizer


def _display_name(spec: ModelSpec) -> str:
    """What to show users for a model."""
    return spec.preset.display if spec.preset else Path(spec.value).name if spec.kind != "hub" else spec.value
