"""Where draftwise keeps its files ($DRAFTWISE_HOME, default ~/.cache/draftwise)."""
from __future__ import annotations

import os
from pathlib import Path


def draftwise_home() -> Path:
    return Path(os.environ.get("DRAFTWISE_HOME") or Path.home() / ".cache" / "draftwise").expanduser()


def models_dir() -> Path:
    return draftwise_home() / "models"


def atomic_write(path: Path, text: str) -> None:
    """Write `path` whole or not at all: through a temporary file of this process's own (two servers
    starting together each write theirs), renamed over it."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def evict_least_recently_used(folder: Path, limit: int) -> None:
    """Remove the least recently used (modified: readers touch what they use) .safetensors files in
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
        elif f.suffix == ".safetensors":
            files.append((st.st_mtime, st.st_size, f))
    total = sum(size for _, size, _ in files)
    for _, size, f in sorted(files):
        if total <= limit:
            break
        f.unlink(missing_ok=True)
        total -= size
