"""Where draftwise keeps its files ($DRAFTWISE_HOME, default ~/.cache/draftwise), and how one is written:
whole or not at all, on the disk before it is in place."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path


def draftwise_home() -> Path:
    return Path(os.environ.get("DRAFTWISE_HOME") or Path.home() / ".cache" / "draftwise").expanduser()


def models_dir() -> Path:
    return draftwise_home() / "models"


def _fsync_folder(folder: Path) -> None:
    """The rename itself on the disk: without it a crash can leave the old name, or none."""
    with contextlib.suppress(OSError):  # some filesystems refuse to open or sync a folder: best effort
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_target(path: Path):
    """Yields a temporary path beside `path` (this process's own: two servers starting together each
    write theirs) for the caller to write; once the caller is done it is synced to the disk and renamed
    over `path`. A rename that is not synced first can reach the disk before the data does: a crash or a
    full disk then leaves a whole-looking name over a torn or empty file. On any error the temporary
    file is removed and the error raised; `path` keeps what it held."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # a full disk can still refuse here, after every write seemed to succeed
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def atomic_write(path: Path, text: str) -> None:
    """Write `path` whole or not at all (atomic_target)."""
    with atomic_target(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def evict_least_recently_used(folder: Path, limit: int, suffix: str = ".safetensors") -> None:
    """Remove the least recently used (modified: readers touch what they use) `suffix` files in
    `folder` beyond `limit` bytes, and temporary files a killed process left more than an hour ago."""
    import time

    files = []
    for f in folder.glob("*"):
        try:
            st = f.stat()
        except OSError:
            continue
        if ".tmp" in f.name and time.time() - st.st_mtime > 3600:
            f.unlink(missing_ok=True)
        elif f.suffix == suffix:
            files.append((st.st_mtime, st.st_size, f))
    total = sum(size for _, size, _ in files)
    for _, size, f in sorted(files):
        if total <= limit:
            break
        f.unlink(missing_ok=True)
        total -= size
