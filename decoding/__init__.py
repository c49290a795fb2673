"""draftwise's engine: speculative decoding tuned for code completion. Never imports pygls."""
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
