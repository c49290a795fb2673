"""Errors the engine raises with a message meant for the user (one clear line, no traceback)."""


class DraftwiseError(Exception):
    """Base class: str(err) is a complete, user-facing sentence."""


class ModelSpecError(DraftwiseError):
    """The model spec names nothing that can be loaded."""


class ModelNotAvailable(DraftwiseError):
    """The model is known but is not on this machine (not pulled, hub unreachable)."""


class ModelLoadError(DraftwiseError):
    """The files exist but could not be loaded (corrupted, unsafe format, out of memory)."""


class PackError(DraftwiseError):
    """The offline pack could not be fetched, assembled or verified."""


class EngineNotReady(DraftwiseError):
    """A request arrived before the models finished loading (or after loading failed)."""


def check_request(request) -> None:
    """Refuse a decoding.api.CompletionRequest naming a drafter or scope that does not exist."""
    from decoding.api import DRAFTERS, SCOPES

    if request.drafter is not None and request.drafter not in DRAFTERS:
        raise ModelSpecError(f"unknown drafter '{request.drafter}': use one of {', '.join(DRAFTERS)}")
    if request.scope not in SCOPES:
        raise ModelSpecError(f"unknown scope '{request.scope}': use one of {', '.join(SCOPES)}")
