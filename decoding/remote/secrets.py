"""The API key: read from the environment, never written to a log.

Nothing in draftwise logs the key, and the HTTP client libraries do not log request headers; as a
second line of defence every log record made in this process has the key replaced by `***` before
any handler sees it (messages, their arguments and exception text alike).
"""
from __future__ import annotations

import logging
import os
import threading

REDACTED = "***"
MIN_SECRET_CHARS = 4  # shorter values would redact ordinary text

_secrets: set[str] = set()
_lock = threading.Lock()
_installed = False


def _scrub(value):
    if isinstance(value, str):
        for secret in _secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, tuple):
        return tuple(_scrub(v) for v in value)
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    text = str(value)  # any other object: its text, which is what a formatter would print
    scrubbed = _scrub(text)
    return scrubbed if scrubbed != text else value


def _install() -> None:
    global _installed
    if _installed:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        if _secrets:
            record.msg = _scrub(record.msg)
            if record.args:
                record.args = _scrub(record.args)
            if record.exc_info and record.exc_info[1] is not None:
                text = logging.Formatter().formatException(record.exc_info)
                if _scrub(text) != text:
                    record.exc_text = _scrub(text)
                    record.exc_info = None
        return record

    logging.setLogRecordFactory(factory)
    _installed = True


def api_key_from_env(name: str) -> str | None:
    """The key in environment variable `name` (None when unset or empty), registered for redaction."""
    key = (os.environ.get(name) or "").strip()
    if not key:
        return None
    if len(key) >= MIN_SECRET_CHARS:
        with _lock:
            _secrets.add(key)
            _install()
    return key
