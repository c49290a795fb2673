"""What a start keeps in $DRAFTWISE_HOME, against real processes and real broken files:

- a disk that fills while a start keeps its quantized model (a real small tmpfs where the tests may
  mount one, and always a real file size limit: RLIMIT_FSIZE) costs the next start its quantizing, with
  one log line, and loses nothing the home held;
- a torn or empty packed int4 layer (a rename that reached the disk before its data) is deleted and
  packed again, with one log line, and the start gives the same text;
- two `draftwise serve` processes starting together on one empty home both get every record, and each
  measurement (exactness probe, forward times, weight timings) and each quantized model is made once:
  the second waits for the first's result.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from safetensors.torch import load_file

from decoding.home import paths
from decoding.kernels import integer_linear, row_ops
from raw_lsp import REPO_ROOT, RawServer

SOURCE = "def add(a, b):\n    return "


@pytest.fixture(scope="module")
def built_kernels() -> Path:
    """The kernels as built in the usual home: each test's home links them instead of building them."""
    integer_linear.load(), row_ops.problem()
    (paths.draftwise_home() / "extensions").mkdir(parents=True, exist_ok=True)
    return paths.draftwise_home() / "extensions"


def new_home(where: Path, built_kernels: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "extensions").symlink_to(built_kernels)
    return where


def complete(home: Path, model, weights: str, tmp_path: Path, file_size_limit: int | None = None) -> tuple[str, list[str]]:
    """`draftwise complete` in a process of its own: (the suggestion's text, its warning and error lines)."""
    source = tmp_path / "sample.py"
    source.write_text(SOURCE)

    def limit() -> None:  # Python ignores SIGXFSZ: a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    run = subprocess.run([sys.executable, "-m", "lsp_server.cli", "complete", str(source), "--line", "1",
                          "--character", "11", "--target", str(model), "--weights", weights, "--json"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "DRAFTWISE_HOME": str(home)}, preexec_fn=limit if file_size_limit else None)
    assert run.returncode == 0, run.stderr
    troubles = [line for line in run.stderr.splitlines() if re.search(r" (WARNING|ERROR|CRITICAL) ", line)]
    return json.loads(run.stdout)["text"], troubles


def contents(home: Path) -> dict[str, bytes]:
    return {str(p.relative_to(home)): p.read_bytes() for p in home.rglob("*")
            if p.is_file() and "extensions" not in p.parts and "locks" not in p.parts}


def assert_nothing_lost(home: Path, before: dict[str, bytes]) -> None:
    """Every file the home held is there, whole: the same bytes, or for a record the same entries and more."""
    for name, data in before.items():
        now = (home / name).read_bytes()
        if name.endswith(".json") and "/" not in name:
            old, new = json.loads(data), json.loads(now)
            assert {k: v for k, v in new.items() if k in old} == old, f"{name} lost entries"
        else:
            assert now == data, f"{name} changed"
    assert [p for p in home.rglob("*.tmp")] == []


@contextlib.contextmanager
def small_filesystem(where: Path, size: str):
    """A real filesystem that fills: a tmpfs of `size`, where this process may mount one (root)."""
    where.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small filesystem needs root: the file size limit test covers a full disk")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): the file size limit test covers a full disk")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(disk: Path, leave: int) -> Path:
    """Fill the filesystem but `leave` bytes."""
    filler = disk / "filler"
    st = os.statvfs(disk)
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    return filler


def test_a_full_disk_costs_the_next_start_its_quantizing_and_nothing_else(tiny_model_dir, tmp_path, built_kernels):
    """A real tmpfs, filled: the quantized model (and packed layers) do not fit."""
    with small_filesystem(tmp_path / "disk", "2m") as disk:
        home = new_home(disk / "home", built_kernels)
        complete(home, tiny_model_dir, "int8", tmp_path)  # what the home held: records, tokenizer, int8 model
        before = contents(home)
        filler = fill(disk, leave=48 << 10)
        text, troubles = complete(home, tiny_model_dir, "int4", tmp_path)
        assert len(troubles) == 1 and "could not keep" in troubles[0] and "No space left on device" in troubles[0], troubles
        assert_nothing_lost(home, before)
        assert not list((home / "quantized").glob("*-int4-*"))
        filler.unlink()
        again, troubles = complete(home, tiny_model_dir, "int4", tmp_path)
        assert (again, troubles) == (text, [])
        assert len(list((home / "quantized").glob("*-int4-*.safetensors"))) == 1


def test_a_write_past_the_file_size_limit_costs_the_next_start_its_quantizing(tiny_model_dir, tmp_path, built_kernels):
    """The same where no filesystem can be mounted: files past 16 KB (the quantized model) are refused by
    the kernel (EFBIG), the records (smaller) are still written."""
    home = new_home(tmp_path / "home", built_kernels)
    complete(home, tiny_model_dir, "int8", tmp_path)
    before = contents(home)
    text, troubles = complete(home, tiny_model_dir, "int4", tmp_path, file_size_limit=16 << 10)
    assert len(troubles) == 1 and "could not keep the quantized model" in troubles[0], troubles
    assert "File too large" in troubles[0] and str(home / "quantized") in troubles[0]
    assert_nothing_lost(home, before)
    exactness = json.loads((home / "exactness.json").read_text())
    assert any("| int4-" in key for key in exactness)  # small records were kept
    again, troubles = complete(home, tiny_model_dir, "int4", tmp_path)
    assert (again, troubles) == (text, [])
    assert len(list((home / "quantized").glob("*-int4-*.safetensors"))) == 1


@pytest.mark.skipif(not integer_linear.load(), reason="int4 layers are packed on draftwise's kernel only")
def test_a_torn_packed_layer_is_packed_again_and_the_start_works(tiny_model_dir, tmp_path, built_kernels):
    home = new_home(tmp_path / "home", built_kernels)
    (home / "quantized").write_text("")  # a file where the folder goes: the quantized model cannot be kept
    text, troubles = complete(home, tiny_model_dir, "int4", tmp_path)
    assert len(troubles) == 1 and "could not keep the quantized model" in troubles[0], troubles
    (home / "quantized").unlink()
    packed = sorted((home / "packed").glob("*.safetensors"), key=lambda p: p.stat().st_size)
    assert len(packed) >= 2
    packed[-1].write_bytes(packed[-1].read_bytes()[: packed[-1].stat().st_size // 2])  # torn
    packed[-2].write_bytes(b"")  # renamed into place before its data reached the disk
    again, troubles = complete(home, tiny_model_dir, "int4", tmp_path)
    assert again == text
    assert len(troubles) == 1 and "packed int4 layer" in troubles[0] and "packing it again" in troubles[0], troubles
    assert len(list((home / "quantized").glob("*-int4-*.safetensors"))) == 1
    # the model's packed layers are in its quantized model now: superseded, removed. What may stay is the
    # 32x128 layer each load packs to try the kernel (decoding/models/weights.py: kernel_problem)
    left = [load_file(str(p))["packed"].shape for p in (home / "packed").glob("*.safetensors")]
    assert set(left) <= {(2, 16, 64)}, left


MEASURED = re.compile(r"INFO decoding\.home\.cache_files: measuring (exactness|forward times) for (.+)$")
TIMED = re.compile(r"INFO decoding\.setup\.weight_choice: measuring weight format timings for (.+): (.+)$")
KEPT = re.compile(r"INFO decoding\.models\.quantized_store: quantized model kept in (.+)$")


def test_two_servers_starting_together_measure_once_and_both_keep_every_entry(tiny_model_dir, tmp_path, built_kernels):
    """Two editor windows opening at once on an empty home: every record ends with every entry, each
    measurement and each quantized model is made by one of them, and both serve the same format."""
    home = new_home(tmp_path / "home", built_kernels)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    servers = [RawServer(["--target", str(tiny_model_dir)], log_path=tmp_path / f"serve{i}.log",
                         env={"DRAFTWISE_HOME": str(home)}) for i in range(2)]
    try:
        for server in servers:
            server.initialize(workspace)
        states = [server.wait_for_state(timeout=600) for server in servers]
        logs = [server.log_text() for server in servers]
        for server in servers:
            assert server.shutdown_and_exit() == 0
    finally:
        for server in servers:
            server.close()
    assert [s["state"] for s in states] == ["ready", "ready"], states
    assert states[0]["weights"] == states[1]["weights"]
    lines = [line for log in logs for line in log.splitlines()]
    measured = Counter(m.groups() for line in lines if (m := MEASURED.search(line)))
    timed = [m.groups() for line in lines if (m := TIMED.search(line))]
    kept = Counter(m.group(1) for line in lines if (m := KEPT.search(line)))
    assert [n for n in list(measured.values()) + list(kept.values()) if n != 1] == [], (measured, kept)
    assert len(timed) == 1, timed

    exactness = json.loads((home / "exactness.json").read_text())
    forward = json.loads((home / "forward-times.json").read_text())
    timings = json.loads((home / "weight-timings.json").read_text())
    assert set(exactness) == {key for what, key in measured if what == "exactness"}
    assert set(forward) == {key for what, key in measured if what == "forward times"} and len(forward) == 1
    [(model, formats)] = timed
    assert list(timings) == [model]
    assert sorted(name.split("-", 1)[0] for name in timings[model]) == sorted(formats.split(", "))
    # the format that serves was probed, once; the others were only timed (quantized ones on stand-ins)
    assert len(exactness) == 1 and states[0]["weights"] in next(iter(exactness))
    assert set(kept) == {str(p) for p in (home / "quantized").glob("*.safetensors")}
