"""The files draftwise keeps in $DRAFTWISE_HOME (decoding/home/cache_files.py): records that several
processes update at once keep every entry; a measurement is made by one process while the others wait
for it; a write that fails (a real file size limit: EFBIG from the kernel) leaves the old file and no
temporary one; a torn packed layer is deleted and packed again; the home stays bounded.

Every process here is a real one: the races are between processes, as between two editor windows."""
from __future__ import annotations

import json
import logging
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from decoding.home import cache_files, paths
from decoding.kernels import integer_linear

ROOT = Path(__file__).resolve().parents[2]


def run_together(codes: list[str], tmp_path: Path, timeout: float = 120) -> list[str]:
    """Run each of `codes` in a Python process of its own, all released at the same moment (each waits
    for a go file); their stdouts."""
    go = tmp_path / "go"
    prelude = (f"import sys, time, os\nsys.path.insert(0, {str(ROOT)!r})\n"
               f"while not os.path.exists({str(go)!r}): time.sleep(0.005)\n")
    children = [subprocess.Popen([sys.executable, "-c", prelude + code], cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for code in codes]
    time.sleep(1.0)  # every child imported and waiting
    go.touch()
    outputs = []
    for child in children:
        out, err = child.communicate(timeout=timeout)
        assert child.returncode == 0, err
        outputs.append(out.strip())
    return outputs


def test_processes_updating_one_record_together_keep_every_entry(tmp_path):
    """Read, modify and write under the record's lock: without it, each process writes back the table
    it read, and the entries another wrote meanwhile are lost."""
    record = tmp_path / "record.json"
    code = (f"from pathlib import Path\nfrom decoding.home import cache_files\n"
            f"for i in range(25):\n"
            f"    cache_files.put_entry(Path({str(record)!r}), f'{{os.getpid()}}-{{i}}', i)\n"
            f"print(os.getpid())")
    pids = run_together([code] * 6, tmp_path)
    kept = json.loads(record.read_text())
    assert set(kept) == {f"{pid}-{i}" for pid in pids for i in range(25)}
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_measurement_is_made_once_while_other_processes_wait_for_it(tmp_path):
    record, made = tmp_path / "record.json", tmp_path / "made"
    code = (f"from pathlib import Path\nfrom decoding.home import cache_files\n"
            f"def measure():\n"
            f"    with open({str(made)!r}, 'a') as f: f.write(f'{{os.getpid()}}\\n')\n"
            f"    time.sleep(1.5)\n"
            f"    return {{'by': os.getpid()}}\n"
            f"value, here = cache_files.kept_or_measured(Path({str(record)!r}), 'model | int8', measure, 'a test')\n"
            f"print(value['by'], here)")
    outputs = run_together([code] * 4, tmp_path)
    measured_by = made.read_text().split()
    assert len(measured_by) == 1, f"measured {len(measured_by)} times"
    assert sorted(outputs) == sorted([f"{measured_by[0]} True"] + [f"{measured_by[0]} False"] * 3)
    assert json.loads(record.read_text()) == {"model | int8": {"by": int(measured_by[0])}}


def test_a_measurement_of_another_key_does_not_wait(tmp_path):
    """Only the same key waits: a model's long measurement holds up no other model's."""
    record = tmp_path / "record.json"

    def code(key: str, seconds: float) -> str:
        return (f"from pathlib import Path\nfrom decoding.home import cache_files\n"
                f"t0 = time.monotonic()\n"
                f"cache_files.kept_or_measured(Path({str(record)!r}), {key!r}, lambda: time.sleep({seconds}) or 1, 'a test')\n"
                f"print({key!r}, round(time.monotonic() - t0, 2))")

    outputs = run_together([code("slow", 3.0), code("fast", 0.0), code("fast too", 0.0)], tmp_path)
    times = [float(o.rsplit(" ", 1)[1]) for o in outputs]
    assert times[0] >= 3.0 and max(times[1:]) < 1.5, outputs


def test_a_torn_record_is_replaced_with_one_log_line(tmp_path, caplog):
    record = tmp_path / "exactness.json"
    record.write_text('{"a": {"exact_width": 17, "max_diff')  # torn mid-write by a crash before fsync existed
    assert cache_files.read_record(record) == {}
    cache_files._said.clear()
    with caplog.at_level(logging.WARNING):
        cache_files.put_entry(record, "b", 1)
        cache_files.put_entry(record, "c", 2)
    assert json.loads(record.read_text()) == {"b": 1, "c": 2}
    [line] = [r.getMessage() for r in caplog.records]
    assert str(record) in line and "unreadable" in line


def test_a_record_keeps_the_entries_written_last(tmp_path):
    record = tmp_path / "record.json"
    for i in range(cache_files.RECORD_ENTRIES + 40):
        cache_files.put_entry(record, f"k{i}", i)
    cache_files.put_entry(record, "k50", 50)  # written again: last now
    kept = json.loads(record.read_text())
    assert len(kept) == cache_files.RECORD_ENTRIES
    assert list(kept)[-2:] == [f"k{cache_files.RECORD_ENTRIES + 39}", "k50"] and "k39" not in kept and "k40" in kept


def _limited(limit: int):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # the kernel answers EFBIG past it
    return set_limit


def test_a_write_past_the_file_size_limit_keeps_the_old_file_and_no_temporary(tmp_path):
    """A real write refused by the kernel (RLIMIT_FSIZE in a child; Python ignores SIGXFSZ, so the write
    fails with EFBIG), through safetensors and through a record: OSError, nothing torn, nothing left."""
    kept, record = tmp_path / "kept.safetensors", tmp_path / "record.json"
    save_file({"w": torch.arange(4, dtype=torch.int32)}, str(kept))
    record.write_text(json.dumps({"old": 1}))
    before = kept.read_bytes(), record.read_bytes()
    code = (f"import errno, json\nfrom pathlib import Path\nimport torch\nfrom decoding.home import cache_files\n"
            f"try:\n    cache_files.write_tensors(Path({str(kept)!r}), {{'w': torch.zeros(1 << 16)}})\n"
            f"except OSError as exc:\n    print('refused', errno.errorcode.get(exc.errno))\n"
            f"    cache_files.could_not_keep('the test tensors', Path({str(tmp_path)!r}), exc, 'as callers do')\n"
            f"print('kept' if cache_files.put_entry(Path({str(record)!r}), 'new', 'x' * 100000) else 'not kept')")
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + code],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, preexec_fn=_limited(64 << 10))
    assert out.stdout.split("\n")[:2] == ["refused EFBIG", "not kept"], out
    warnings = [line for line in out.stderr.splitlines() if "could not keep" in line]
    assert len(warnings) == 1 and "File too large" in warnings[0], out.stderr  # the same trouble twice: one line
    assert (kept.read_bytes(), record.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.safetensors", "locks", "record.json"]


@pytest.mark.skipif(not integer_linear.load(), reason="int4 layers are packed on draftwise's kernel only")
@pytest.mark.parametrize("damage", ["empty", "torn", "another layer's"])
def test_a_damaged_packed_layer_is_deleted_and_packed_again(tmp_path, monkeypatch, caplog, damage):
    """A packed file that is empty (a rename that reached the disk before its data), torn, or holding
    another layout: deleted and packed again, with one log line, and the codes are the fresh pack's."""
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    torch.manual_seed(0)
    weight = nn.Linear(256, 64).weight
    fresh = integer_linear.pack(weight.detach().float())
    integer_linear.cached_pack(weight)
    [kept] = (tmp_path / "packed").glob("*.safetensors")
    if damage == "empty":
        kept.write_bytes(b"")
    elif damage == "torn":
        kept.write_bytes(kept.read_bytes()[: kept.stat().st_size // 2])
    else:
        save_file({"packed": torch.zeros(2, 2, dtype=torch.uint8), "scales": torch.zeros(1), "lows": torch.zeros(1)},
                  str(kept))
    cache_files._said.clear()
    with caplog.at_level(logging.WARNING):
        again = integer_linear.cached_pack(weight)
    assert all(torch.equal(a, b) for a, b in zip(again, fresh))
    [line] = [r.getMessage() for r in caplog.records]
    assert "packed int4 layer" in line and kept.name in line and "packing it again" in line
    assert all(torch.equal(a, load_file(str(kept))[n]) for a, n in zip(fresh, ("packed", "scales", "lows")))


def _aged(path: Path, seconds: float, size: int = 10, folder: bool = False) -> Path:
    """A file (or a folder holding one) last used `seconds` ago."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if folder:
        path.mkdir()
        (path / "lib.so").write_bytes(b"x" * size)
    else:
        path.write_bytes(b"x" * size)
    os.utime(path, (time.time() - seconds, time.time() - seconds))
    return path


def test_housekeeping_removes_what_no_start_of_this_version_reads(tmp_path):
    """A long-lived home: kernel builds of older versions, packed layers of other packing code,
    quantized models of other forward code unused for a week, and temporary files of killed writes go;
    what this version reads, and what other code used lately, stays."""
    hour, day = 3600, 86400
    gone = [
        _aged(tmp_path / "extensions" / "q4_kernel-torch2.5.1+cpu", 2 * hour, folder=True),
        _aged(tmp_path / "extensions" / "draftwise_integer_linear-avx512vnni-torch2.7.0+cpu", 2 * hour, folder=True),
        _aged(tmp_path / "extensions" / "draftwise_row_ops-avx2-torch2.7.0+cpu", 2 * hour, folder=True),
        _aged(tmp_path / "packed" / "0123abcd-g32-v2.safetensors", 2 * hour),
        _aged(tmp_path / "quantized" / "5eed-int8-q8+rows-avx2-0ldc0de00000.safetensors", 8 * day),
        _aged(tmp_path / "quantized" / ".5eed-int4.safetensors.k2j3.tmp", 2 * hour),
        _aged(tmp_path / ".exactness.json.a8b.tmp", 2 * hour),
        _aged(tmp_path / "locks" / "exactness.json.0123456789abcdef", 2 * day),  # no start measured it lately
    ]
    stays = [
        _aged(tmp_path / "extensions" / "draftwise_integer_linear-avx512vnni-torch2.13.0+cpu-e7f28e2fbb27", 30 * day,
              folder=True),
        _aged(tmp_path / "extensions" / "q4_kernel-torch2.5.1+cu121", 60, folder=True),  # an older version may be loading it
        _aged(tmp_path / "packed" / "4567-g32-c0de.safetensors", 30 * day),
        _aged(tmp_path / "packed" / "89ab-g32-v2.safetensors", 60),
        _aged(tmp_path / "quantized" / "beef-int8-q8+rows-avx2-0ldc0de00000.safetensors", 2 * day),
        _aged(tmp_path / "quantized" / "5eed-int4-q4q8+rows-avx2-c0dec0dec0de.safetensors", 30 * day),
        _aged(tmp_path / "quantized" / ".5eed-int8.safetensors.x1.tmp", 60),  # being written right now
        _aged(tmp_path / "exactness.json", 30 * day),
        _aged(tmp_path / "locks" / "exactness.json.lock", 30 * day),  # the record's own
        _aged(tmp_path / "locks" / "packed.fedcba9876543210", hour),
        _aged(tmp_path / "models" / "qwen" / "model.safetensors", 30 * day),
    ]
    for source, kept in ((tmp_path / "deleted-checkout", gone), (tmp_path / "models" / "qwen", stays)):
        made = tmp_path / "quantized" / f"{source.name}-int8-q8+rows-avx2-c0dec0dec0de.safetensors"
        save_file({"w": torch.zeros(2)}, str(made), metadata={"source": str(source)})
        kept.append(made)
        os.utime(made, (time.time() - 2 * hour,) * 2)
    cache_files.housekeeping.__wrapped__(tmp_path, "c0de", "c0dec0dec0de")
    assert [p for p in gone if p.exists()] == []
    assert [p for p in stays if not p.exists()] == []


def test_a_record_forgets_the_models_whose_folder_is_gone(tmp_path):
    record, model = tmp_path / "record.json", tmp_path / "model"
    model.mkdir()
    cache_files.put_entry(record, f"probe 1 | {tmp_path / 'moved'} | int8", 1)
    cache_files.put_entry(record, f"probe 1 | {model} | int8", 2)
    cache_files.put_entry(record, "probe 1 | qwen2.5-coder-0.5b | int8", 3)
    assert json.loads(record.read_text()) == {f"probe 1 | {model} | int8": 2, "probe 1 | qwen2.5-coder-0.5b | int8": 3}


def test_tokenizers_are_kept_to_a_bound_least_recently_used_first(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_files, "TOKENIZERS_BYTES", 250)
    files = [_aged(tmp_path / "tokenizers" / f"{i}.json", 100 - i, size=100) for i in range(4)]
    cache_files.housekeeping.__wrapped__(tmp_path, "c0de", "c0dec0dec0de")
    assert [f.exists() for f in files] == [False, False, True, True]


def test_clean_removes_every_cache_and_keeps_the_models(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    for name in ("quantized/a.safetensors", "packed/b.safetensors", "tokenizers/c.json", "extensions/k-1/k.so",
                 "exactness.json", "forward-times.json", "weight-timings.json", "target-choice.json", "locks/x.lock"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * 1000)
    model = tmp_path / "models" / "qwen" / "model.safetensors"
    model.parent.mkdir(parents=True)
    model.write_bytes(b"weights")
    out = subprocess.run([sys.executable, "-m", "lsp_server.cli", "models", "clean"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "DRAFTWISE_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"] and model.read_bytes() == b"weights"
    assert "freed 0.0 MiB" in out.stdout and str(tmp_path / "quantized") in out.stdout


def test_an_atomic_write_is_synced_before_its_rename(tmp_path, monkeypatch):
    """The data reaches the disk before the name does: else a crash can leave the new name over an empty
    file (the torn packed files of the issue)."""
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: calls.append("rename") or real_replace(a, b))
    paths.atomic_write(tmp_path / "f.json", "{}")
    assert calls[:2] == ["fsync", "rename"] and (tmp_path / "f.json").read_text() == "{}"
