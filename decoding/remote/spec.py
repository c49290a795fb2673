"""Remote target specs.

    openai:http://host:8000/v1#model-name          OpenAI-compatible /v1/completions (vLLM, SGLang,
                                                    llama.cpp's server, llama-cpp-python's server)
    llamacpp:http://host:8080#model-name            llama.cpp's native /infill (the model is optional)

Options follow the model name after `?`, separated by `&`:

    tokenizer=SPEC    where the FIM prompt's tokenizer comes from (a preset, a model directory or a
                      hub id in the local cache); default: the model name when it is one of those,
                      else the preset of the same model family (openai only; /infill builds the
                      prompt on the server)
    timeout=SECONDS   client-side deadline of one request (default 30)
    api_key_env=NAME  the environment variable holding the API key (default DRAFTWISE_API_KEY);
                      the key itself never appears in a spec, a setting or a log
    ca=PATH           a CA bundle for https servers with a private certificate authority
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from decoding.errors import ModelSpecError

DEFAULT_API_KEY_ENV = "DRAFTWISE_API_KEY"
DEFAULT_TIMEOUT_S = 30.0
OPTIONS = ("tokenizer", "timeout", "api_key_env", "ca")


@dataclass(frozen=True)
class RemoteSpec:
    api: str  # "openai" | "llamacpp"
    url: str  # base URL: ends in /v1 for openai, the server root for llamacpp
    model: str  # the served model's name ("" : whatever the server serves; llamacpp only)
    tokenizer: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    api_key_env: str = DEFAULT_API_KEY_ENV
    ca: str | None = None

    @property
    def display(self) -> str:
        return f"{self.api}:{self.url}" + (f"#{self.model}" if self.model else "")


def parse_remote_target(text: str) -> RemoteSpec:
    text = (text or "").strip()
    api, _, rest = text.partition(":")
    api = api.lower()
    if api not in ("openai", "llamacpp"):
        raise ModelSpecError(f"not a remote target: {text!r} (use openai:URL#MODEL or llamacpp:URL)")
    url, _, fragment = rest.partition("#")
    model, _, query = fragment.partition("?")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ModelSpecError(f"remote target {text!r}: the server URL must start with http:// or https:// and name a host")
    if parts.username or parts.password:
        raise ModelSpecError("remote target: put no credentials in the URL; set the API key in the environment "
                             f"variable {DEFAULT_API_KEY_ENV} instead")
    if parts.query:
        raise ModelSpecError(f"remote target {text!r}: options go after the model name (#MODEL?timeout=30)")
    model = model.strip()
    if api == "openai" and not model:
        raise ModelSpecError(f"remote target {text!r} names no model: add #MODEL (the name the server serves it as)")
    options: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in OPTIONS:
            raise ModelSpecError(f"remote target: unknown option '{key}' (known: {', '.join(OPTIONS)})")
        options[key] = value.strip()
    timeout = DEFAULT_TIMEOUT_S
    if "timeout" in options:
        try:
            timeout = float(options["timeout"])
        except ValueError:
            timeout = math.nan
        if not math.isfinite(timeout) or timeout <= 0:
            raise ModelSpecError(f"remote target: timeout must be a positive number of seconds, got {options['timeout']!r}")
    key_env = options.get("api_key_env") or DEFAULT_API_KEY_ENV
    if not key_env.replace("_", "").isalnum():
        raise ModelSpecError(f"remote target: api_key_env must name an environment variable, got {key_env!r}")
    base = url.rstrip("/")
    return RemoteSpec(api=api, url=base, model=model, tokenizer=options.get("tokenizer") or None,
                      timeout_s=timeout, api_key_env=key_env, ca=options.get("ca") or None)
