"""What draftwise keeps in $DRAFTWISE_HOME besides the models, and the rules every kept file follows.

- Written whole or not at all (paths.atomic_target: synced, then renamed). A write that fails (a full
  disk, a read-only home) costs the next start the work, and says so in one log line.
- A kept file that cannot be read is deleted, and made again.
- Records (exactness verdicts, forward times, weight timings: JSON tables) are changed under a lock
  of their file, read, modified and written inside it: two servers starting together keep both their
  entries. A measurement another process is making for the same key is waited for, not made twice.
- Bounded: each folder to a size, each record to its entries written last; what no code of this
  version reads (files made by other code, kernel builds of older versions) goes (housekeeping).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import inspect
import json
import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

from decoding.home import paths

log = logging.getLogger(__name__)

RECORD_ENTRIES = 256  # entries a record keeps, those written last (one a model, format, code and device)
LOCKS_KEPT_S = 86400.0  # a measurement's lock file unused this long is removed (housekeeping)
WAIT_S = 1200.0  # the longest a start waits for another process's measurement (a 1.5B's first start: minutes)
STALE_S = 3600.0  # a temporary file, or a file of other code, unused this long is no one's work in progress
OTHER_CODE_KEPT_S = 7 * 86400  # a quantized model of other code (a rollback, another checkout) kept a week
TOKENIZERS_BYTES = 64 << 20  # ~7 MB a Qwen tokenizer: a few models and transformers versions
# kernel builds of older versions, which no code of this one loads: the int4 kernel's first home, and
# builds named before decoding/kernels/build.py added a hash of their code to the name
OLD_EXTENSION = re.compile(r"q4_kernel-torch[^-]*|draftwise_q4_kernel-.*|draftwise_(integer_linear|row_ops)-[a-z0-9]+-torch[^-]*")


def code_hash(*functions: Callable, extra: str = "") -> str:
    """A hash of the source of the functions that make a kept artifact, and of `extra` (the torch
    version its arithmetic runs on, say): artifacts made by other code are never read."""
    digest = hashlib.blake2b(extra.encode(), digest_size=6)
    for function in functions:
        try:
            digest.update(inspect.getsource(function).encode())
        except (OSError, TypeError):  # no source installed: its name stands in
            digest.update(function.__qualname__.encode())
    return digest.hexdigest()


# ---- one log line per trouble ----------------------------------------------------------------------

_said: set[tuple] = set()
_said_lock = threading.Lock()


def _once(key: tuple) -> bool:
    with _said_lock:
        if key in _said:
            return False
        _said.add(key)
        return True


def reason(exc: BaseException) -> str:
    """An error in one line (safetensors' messages carry the OS error's debug text)."""
    text = str(getattr(exc, "strerror", None) or exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:200]


def could_not_keep(what: str, where: Path, exc: BaseException, then: str) -> None:
    """A kept file could not be written. A full disk fails every write of a start the same way: the
    first says so, the others only at debug level."""
    kind = getattr(exc, "errno", None) or type(exc).__name__
    level = logging.WARNING if _once(("write", kind)) else logging.DEBUG
    log.log(level, "could not keep %s in %s (%s): %s", what, where, reason(exc), then)


def unreadable(what: str, where: Path, exc: BaseException, then: str) -> None:
    level = logging.WARNING if _once(("read", what)) else logging.DEBUG
    log.log(level, "%s %s is unreadable (%s): deleted, %s", what, where, reason(exc), then)


def discard(where: Path, seen: os.stat_result | None) -> None:
    """Delete a file found unreadable, unless another process has renamed a new one over it since it
    was looked at (`seen`: its stat then)."""
    with contextlib.suppress(OSError):
        now = where.stat()
        if seen is None or (now.st_ino, now.st_size, now.st_mtime_ns) == (seen.st_ino, seen.st_size, seen.st_mtime_ns):
            where.unlink()


def tensor_errors() -> tuple[type[BaseException], ...]:
    """What reading or writing a safetensors file raises: the filesystem's errors, and safetensors'
    own (SafetensorError is no OSError: a full disk or a torn header raise it)."""
    from safetensors import SafetensorError

    return (OSError, SafetensorError, ValueError, RuntimeError, KeyError, TypeError, OverflowError, MemoryError)


def write_tensors(where: Path, tensors: dict, metadata: dict[str, str] | None = None) -> None:
    """safetensors' file, whole or not at all; OSError for every failure (the caller logs it)."""
    from safetensors.torch import save_file

    try:
        with paths.atomic_target(where) as tmp:
            save_file(tensors, str(tmp), metadata=metadata)
    except OSError:
        raise
    except tensor_errors() as exc:
        # safetensors' Rust side says the OS error in its text: "... (os error 28)"
        code = re.search(r"os error (\d+)", str(exc))
        raise OSError(int(code.group(1)) if code else errno.EIO, reason(exc)) from exc


def touch(where: Path) -> None:
    """Used: eviction keeps the files used last."""
    with contextlib.suppress(OSError):
        os.utime(where)


# ---- locks -----------------------------------------------------------------------------------------

_held = threading.local()  # lock files this thread holds: a nested wait for one of them would never end


@contextlib.contextmanager
def _flocked(lock: Path, waiting: Callable[[], None] | None = None, wait_s: float | None = None,
             gave_up: Callable[[], None] | None = None):
    """An exclusive lock on `lock` across processes and threads (flock: released by the kernel when a
    holder dies, however it dies). Yields True once held; False when the home cannot hold a lock file
    (read-only, no flock) or `wait_s` passed (`gave_up` is called): the caller then goes on unguarded,
    as a lone process would."""
    held: set = getattr(_held, "paths", None) or set()
    _held.paths = held
    if lock in held:
        yield True
        return
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock, "a")
    except OSError:
        yield False
        return
    with handle:
        if not _acquire(handle, waiting, wait_s):
            if gave_up:
                gave_up()
            yield False
            return
        held.add(lock)
        try:
            yield True
        finally:
            held.discard(lock)
            fcntl.flock(handle, fcntl.LOCK_UN)


def _acquire(handle, waiting: Callable[[], None] | None, wait_s: float | None) -> bool:
    deadline = None if wait_s is None else time.monotonic() + wait_s
    pause = 0.02
    try:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if waiting:
                    waiting()
                    waiting = None
                if deadline is not None and time.monotonic() > deadline:
                    return False
                time.sleep(pause)
                pause = min(pause * 2, 0.25)
    except OSError:  # a filesystem without flock: unguarded, as before locks
        return False


def _lock_folder(folder: Path) -> Path:
    return folder / "locks"


@contextlib.contextmanager
def one_at_a_time(folder: Path, kind: str, key: str, what: str):
    """Held while this process measures or builds `key` of `kind`: another process after the same key
    waits here, then finds the result kept and uses it; other keys never wait for it (a lock file a
    key: a 1.5B's minutes of timing hold up no 0.5B). Yields whether the lock is held."""
    lock = _lock_folder(folder) / f"{kind}.{hashlib.blake2b(key.encode(), digest_size=8).hexdigest()}"
    touch(lock)  # used: housekeeping removes the lock files of keys no start asked for in a day

    def waiting() -> None:
        if _once(("wait", kind, what)):
            log.info("waiting for %s from another start", what)

    def gave_up() -> None:
        log.warning("gave up waiting %.0f s for %s from another start: making them here", WAIT_S, what)

    with _flocked(lock, waiting, WAIT_S, gave_up) as held:
        yield held


# ---- records: JSON tables of measurements --------------------------------------------------------

def read_record(file: Path) -> dict:
    """The table in `file`; empty when there is none or it is unreadable (the next update replaces it)."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def update_record(file: Path, change: Callable[[dict], None], entries: int = RECORD_ENTRIES) -> bool:
    """Apply `change` to the table in `file` under its lock, read and written inside it (another process's
    entries written meanwhile are kept), keeping the `entries` written last. False when it could not be
    written (logged): the table on disk keeps what it held."""
    lock = _lock_folder(file.parent) / f"{file.name}.lock"
    # held for milliseconds by a writer: a minute's wait is a writer stopped (a debugger): write anyway
    with _flocked(lock, wait_s=60.0):
        data: dict = {}
        seen = None
        try:
            seen = file.stat()
            data = json.loads(file.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not a table")
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError) as exc:
            unreadable("record", file, exc, "its entries are measured again")
            discard(file, seen)
            data = {}
        change(data)
        for key in list(data)[:max(0, len(data) - entries)]:  # the oldest written first (dicts keep order)
            del data[key]
        try:
            paths.atomic_write(file, json.dumps(data, indent=1))
        except OSError as exc:
            could_not_keep(f"the record {file.name}", file.parent, exc, "the next start measures again")
            return False
    return True


def _names_a_gone_model(key: str) -> bool:
    """Whether a record's key names a model directory that is gone (a moved checkout, a test's): its
    entries are never read again."""
    return any(part.startswith("/") and not os.path.exists(part) for part in key.split(" | "))


def put_entry(file: Path, key: str, value: Any) -> bool:
    def change(data: dict) -> None:
        for gone in [k for k in data if k != key and _names_a_gone_model(k)]:
            del data[gone]
        data.pop(key, None)  # to the end: written last, evicted last
        data[key] = value
    return update_record(file, change)


def kept_or_measured(file: Path, key: str, measure: Callable[[], Any], what: str,
                     valid: Callable[[Any], bool] = lambda value: True) -> tuple[Any, bool]:
    """The entry `key` of the record `file`, measured (and kept) when there is none: by this process,
    or by another already measuring it, which this one waits for. Returns (value, measured here)."""
    def kept() -> Any:
        value = read_record(file).get(key)
        try:
            return value if value is not None and valid(value) else None
        except (KeyError, TypeError, ValueError, AttributeError):  # written by another version
            return None

    if (value := kept()) is not None:
        return value, False
    with one_at_a_time(file.parent, file.name, key, what):
        if (value := kept()) is not None:  # measured by another process while this one waited
            return value, False
        log.info("measuring %s for %s", what, key)
        value = measure()
        put_entry(file, key, value)
    return value, True


# ---- bounds --------------------------------------------------------------------------------------

def _age(path: Path) -> float:
    try:
        return time.time() - path.lstat().st_mtime
    except OSError:
        return 0.0


def _remove(path: Path) -> int:
    """Remove a file or folder; the bytes freed."""
    size = tree_size(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()
    return size


def tree_size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(OSError):
            return path.lstat().st_size
        return 0
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def safetensors_metadata(where: Path) -> dict:
    """A safetensors file's metadata, its header alone read; {} when it has none or cannot be read."""
    try:
        with open(where, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size)) if 0 < size <= 100 << 20 else {}
        return dict(header.get("__metadata__") or {})
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def evict_other_code(folder: Path, current: str, kept_s: float) -> None:
    """Remove files in `folder` named `...-CODE.safetensors` whose CODE is not `current` and that were not
    used in `kept_s` seconds: made by other code, which this version never reads."""
    for f in folder.glob("*.safetensors"):
        if not f.stem.endswith("-" + current) and _age(f) > kept_s:
            with contextlib.suppress(OSError):
                f.unlink()


@functools.lru_cache(maxsize=None)
def housekeeping(home: Path, pack_code: str, forward_code: str) -> None:
    """Once a process and home: remove what no start of this version reads. Temporary files of writes a
    killed process left, packed int4 layers of other packing code than `pack_code`, quantized models of
    other forward code than `forward_code` not used for a week or of a checkpoint that is gone, kernel
    builds of older versions, lock files of measurements no start made in a day; tokenizers kept to
    TOKENIZERS_BYTES."""
    if not home.is_dir():
        return
    try:
        for folder in (home, home / "quantized", home / "packed", home / "tokenizers"):
            for tmp in folder.glob(".*.tmp"):
                if _age(tmp) > STALE_S:
                    _remove(tmp)
        evict_other_code(home / "packed", pack_code, STALE_S)
        evict_other_code(home / "quantized", forward_code, OTHER_CODE_KEPT_S)
        for lock in (home / "locks").glob("*.*"):
            if not lock.name.endswith(".lock") and _age(lock) > LOCKS_KEPT_S:  # a record's own lock stays
                _remove(lock)
        for kept in (home / "quantized").glob("*.safetensors"):  # made from a checkpoint that is gone
            source = safetensors_metadata(kept).get("source")
            if source and not os.path.exists(source) and _age(kept) > STALE_S:
                _remove(kept)
        paths.evict_least_recently_used(home / "tokenizers", TOKENIZERS_BYTES, suffix=".json")
        for old in (home / "extensions").glob("*"):
            if OLD_EXTENSION.fullmatch(old.name) and old.is_dir() and _age(old) > STALE_S:
                _remove(old)
    except OSError as exc:  # housekeeping never fails a start
        log.debug("housekeeping of %s stopped: %s", home, exc)


# ---- `draftwise models clean` --------------------------------------------------------------------

CACHES = {  # what a start makes again, and what each costs it
    "quantized": "quantized models (a start quantizes again: seconds; the 1.5B's int4 about a minute)",
    "packed": "packed int4 layers not yet in a quantized model",
    "tokenizers": "tokenizers as transformers built them (a start builds them again: ~1 s)",
    "extensions": "the C++ kernels (a start builds them again: ~40 s each)",
    "exactness.json": "exactness verdicts (a start probes again: seconds)",
    "forward-times.json": "forward times (a start times again: seconds)",
    "weight-timings.json": "weight format timings (`auto` times every format again: a minute or more)",
    "target-choice.json": "the 1.5B's speed on this CPU, which `target: auto` reads (measured again: ~2 s)",
    "locks": "lock files",
}


def caches(home: Path | None = None) -> list[tuple[Path, int, str]]:
    """The caches present in the home: (path, bytes, what)."""
    home = home or paths.draftwise_home()
    return [(home / name, tree_size(home / name), what) for name, what in CACHES.items()
            if (home / name).exists() or (home / name).is_symlink()]


def clean(home: Path | None = None) -> list[tuple[Path, int, str]]:
    """Remove every cache of the home (never the models): what was removed."""
    removed = caches(home)
    for path, _, _ in removed:
        _remove(path)
    return removed
