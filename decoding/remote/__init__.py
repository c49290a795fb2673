"""Serving from an existing inference engine (vLLM, SGLang, llama.cpp's server) instead of in-process.

A target spec that names a server (`openai:http://host:8000/v1#model-name`, or
`llamacpp:http://host:8080` for llama.cpp's native `/infill`) selects `decoding.remote.remote_engine.RemoteEngine`,
which offers the LSP layer the same methods as `decoding.engine.Engine`. Everything above the model
(prompt, stop rules, post-processing, type-ahead, stats, cancellation) stays in draftwise.

This module stays light (no torch, no HTTP client) so that choosing an engine costs nothing.
"""
from __future__ import annotations

SCHEMES = ("openai", "llamacpp")


def is_remote_target(target: str | None) -> bool:
    head, sep, rest = (target or "").strip().partition(":")
    return bool(sep) and head.lower() in SCHEMES and rest.startswith(("http://", "https://"))


def engine_class(target: str | None) -> tuple[str, str]:
    """The module and the name of the class that serves this target."""
    if is_remote_target(target):
        return "decoding.remote.remote_engine", "RemoteEngine"
    return "decoding.engine", "Engine"
