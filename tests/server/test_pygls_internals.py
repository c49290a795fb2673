"""The pygls internals lsp_server/protocol.py overrides or reads, checked against the installed pygls.

pyproject.toml pins pygls to the releases these were checked on. Before widening the pin, run this
file on the new release: a failure names the member that moved, and the override in protocol.py
that depends on it has to be re-read against the new pygls source.
"""
from __future__ import annotations

import importlib.metadata
import inspect

import pytest
from lsprotocol import types
from pygls.protocol import JsonRPCProtocol, LanguageServerProtocol

from decoding.api import EngineConfig
from lsp_server.protocol import DraftwiseProtocol
from lsp_server.server import create_server

PYGLS = importlib.metadata.version("pygls")

# Methods whose behaviour protocol.py relies on: name -> the parameters it calls or overrides them with.
METHODS = {
    "_send_data": ["self", "data"],
    "_execute_handler": ["self", "msg_id", "handler", "callback", "args", "kwargs"],
    "_handle_request": ["self", "msg_id", "method_name", "params"],
    "get_message_type": ["self", "method"],
    "handle_message": ["self", "message"],
}
# Attributes set in pygls' constructor that protocol.py reads: name -> their type.
ATTRIBUTES = {"_request_futures": dict, "_result_types": dict, "_server": object, "_converter": object}
# pygls' document sync handlers, replaced so that its workspace copy is never made.
DOCUMENT_SYNC = {
    types.TEXT_DOCUMENT_DID_OPEN: "lsp_text_document__did_open",
    types.TEXT_DOCUMENT_DID_CHANGE: "lsp_text_document__did_change",
    types.TEXT_DOCUMENT_DID_CLOSE: "lsp_text_document__did_close",
}


def moved(member: str, detail: str) -> str:
    return (f"pygls {PYGLS}: {member} {detail}. lsp_server/protocol.py depends on it; re-check the "
            f"override against this pygls before widening the pin in pyproject.toml.")


@pytest.mark.parametrize("name", METHODS)
def test_overridden_methods_keep_their_signature(name):
    method = getattr(JsonRPCProtocol, name, None)
    assert callable(method), moved(f"JsonRPCProtocol.{name}", "is gone")
    parameters = list(inspect.signature(method).parameters)
    assert parameters == METHODS[name], moved(
        f"JsonRPCProtocol.{name}", f"takes ({', '.join(parameters)}), not ({', '.join(METHODS[name])})")


@pytest.fixture(scope="module")
def protocol():
    return create_server(EngineConfig()).protocol


@pytest.mark.parametrize("name", ATTRIBUTES)
def test_constructor_attributes_are_still_there(protocol, name):
    assert isinstance(protocol, DraftwiseProtocol)
    assert hasattr(protocol, name), moved(f"JsonRPCProtocol.{name}", "is no longer set by the constructor")
    assert isinstance(getattr(protocol, name), ATTRIBUTES[name]), moved(
        f"JsonRPCProtocol.{name}", f"is a {type(getattr(protocol, name)).__name__}, not a {ATTRIBUTES[name].__name__}")


@pytest.mark.parametrize("method", DOCUMENT_SYNC)
def test_document_sync_overrides_replace_pygls_handlers(protocol, method):
    name = DOCUMENT_SYNC[method]
    original = getattr(LanguageServerProtocol, name, None)
    assert original is not None and getattr(original, "method_name", None) == method, moved(
        f"LanguageServerProtocol.{name}", f"no longer handles {method}")
    assert list(inspect.signature(original).parameters) == ["self", "params"], moved(
        f"LanguageServerProtocol.{name}", "changed its parameters")
    handler = protocol.fm.builtin_features.get(method)
    assert getattr(handler, "__func__", None) is getattr(DraftwiseProtocol, name), moved(
        "LanguageServerProtocol built-in features", f"no longer dispatch {method} to our override")
