"""draftwise's engine: speculative decoding tuned for code completion. Never imports pygls."""
import os as _os

from decoding.models.paths import draftwise_home as _home

# Compiled graphs (decoding/models/compiled_forward.py) outlive a reboot next to the models, unless
# the user chose a place; set before torch is imported, which fixes inductor's cache directory.
_os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_home() / "inductor"))
from decoding.api import (
    DRAFTERS,
    SCOPES,
    CancelToken,
    CompletionRequest,
    CompletionResult,
    ContextFile,
    EngineConfig,
    RequestStats,
)
from decoding.errors import DraftwiseError

__all__ = [
    "DRAFTERS", "SCOPES", "CancelToken", "CompletionRequest", "CompletionResult", "ContextFile",
    "DraftwiseError", "Engine", "EngineConfig", "Job", "RequestStats",
]


def __getattr__(name):  # the engine pulls in torch; keep `import decoding` light for the CLI
    if name in ("Engine", "Job"):
        from decoding import engine

        return getattr(engine, name)
    raise AttributeError(name)
