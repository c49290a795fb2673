"""The in-process and the remote engine are one interface to the server: decoding.api.CompletionEngine."""
import inspect

import pytest

from decoding.api import CompletionEngine, EngineConfig


def _members(cls) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(getattr(cls, name)) for name in dir(CompletionEngine)
            if not name.startswith("_") and callable(getattr(CompletionEngine, name, None))}


@pytest.mark.parametrize("module, name", [("decoding.engine", "Engine"),
                                          ("decoding.remote.remote_engine", "RemoteEngine")])
def test_each_engine_implements_the_protocol_with_its_signatures(module, name):
    import importlib

    engine_class = getattr(importlib.import_module(module), name)
    wanted = _members(CompletionEngine)
    assert {"submit", "complete", "start_loading", "info", "stats", "close"} <= set(wanted)
    for name, signature in wanted.items():
        assert hasattr(engine_class, name), f"{module}.{engine_class.__name__} has no {name}"
        got = inspect.signature(getattr(engine_class, name))
        assert [(p.name, p.default) for p in got.parameters.values()] == \
               [(p.name, p.default) for p in signature.parameters.values()], f"{module}.{engine_class.__name__}.{name}{got}"


def test_constructed_engines_are_completion_engines():
    from decoding.engine import Engine as LocalEngine
    from decoding.remote.remote_engine import RemoteEngine

    local = LocalEngine(EngineConfig(target="qwen2.5-coder-0.5b"))
    remote = RemoteEngine(EngineConfig(target="openai:http://127.0.0.1:9/v1#m"))
    try:
        assert isinstance(local, CompletionEngine) and isinstance(remote, CompletionEngine)
        assert local.state == remote.state  # neither has started loading
    finally:
        local.close()
        remote.close()
