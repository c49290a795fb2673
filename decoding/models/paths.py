"""Where draftwise keeps its files ($DRAFTWISE_HOME, default ~/.cache/draftwise)."""
from __future__ import annotations

import os
from pathlib import Path


def draftwise_home() -> Path:
    return Path(os.environ.get("DRAFTWISE_HOME") or Path.home() / ".cache" / "draftwise").expanduser()


def models_dir() -> Path:
    return draftwise_home() / "models"
