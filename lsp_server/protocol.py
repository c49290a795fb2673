"""What pygls' protocol class leaves to the server: the JSON-RPC envelope and the LSP life cycle.

`DraftwiseProtocol.receive` takes each parsed message from the transport (transport.py) and

- answers what is not a valid JSON-RPC message with InvalidRequest (id null when the id is unusable:
  null, a fraction, an overflow that reads as infinity, an object);
- applies the life cycle: before `initialize` a request gets ServerNotInitialized and a notification
  is dropped; after `shutdown` a request gets InvalidRequest; `exit` ends the session with code 0 when
  a shutdown came first and 1 otherwise (LSP, "exit");
- turns params that do not fit the method's type into InvalidParams (pygls drops such a request
  unanswered), and lets a request leave params out, as JSON-RPC allows;
- forgets each handler's future when it is done (pygls keeps one per notification, for ever).

Several of these override or read pygls internals, so pyproject.toml pins pygls to the releases they
were checked on; tests/server/test_pygls_internals.py names any of them that moves.
"""
from __future__ import annotations

import contextvars
import logging
from typing import Any

import cattrs
from cattrs.errors import ClassValidationError
from lsprotocol import types
from pygls.exceptions import (
    JsonRpcException, JsonRpcInvalidParams, JsonRpcInvalidRequest, JsonRpcServerNotInitialized,
)
from pygls.protocol import LanguageServerProtocol, lsp_method
from pygls.protocol.json_rpc import (
    JsonRPCNotification, JsonRPCRequestMessage, JsonRPCResponseMessage, ResponseErrorMessage,
)

log = logging.getLogger(__name__)

# Document version when a completion request arrived. Requests run as tasks that start a loop turn
# later; a didChange read in between (possible when several messages arrive in one read) must make
# the request stale rather than have its position read against newer text.
arrival_version: contextvars.ContextVar[int | None] = contextvars.ContextVar("arrival_version", default=None)
_COMPLETION_METHODS = (types.TEXT_DOCUMENT_INLINE_COMPLETION, types.TEXT_DOCUMENT_COMPLETION)


def valid_id(value: Any) -> bool:
    """JSON-RPC ids are strings or integers (LSP: integer | string); bool is an int to Python only."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def describe(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


class DraftwiseProtocol(LanguageServerProtocol):
    def __init__(self, server, converter) -> None:
        super().__init__(server, converter)
        self.initialize_received = False
        self.shutdown_received = False
        self.exit_code: int | None = None  # set by `exit`; the transport stops reading then

    # ---- errors the protocol answers itself ----------------------------------------------------

    def send_error(self, msg_id: Any, error: JsonRpcException) -> None:
        """An error response. id null is written out (pygls leaves out None fields, and a response
        without an id is not a response)."""
        body: dict[str, Any] = {"code": error.code, "message": error.message}
        if error.data is not None:
            body["data"] = error.data
        self._send_data({"jsonrpc": self.VERSION, "id": msg_id if valid_id(msg_id) else None, "error": body})

    # ---- one message in ------------------------------------------------------------------------

    def receive(self, data: Any) -> None:
        """Handle one message as parsed from the wire (any JSON value)."""
        if not isinstance(data, dict):
            # LSP has no batches; JSON-RPC answers anything else that is not an object this way too.
            self.send_error(None, JsonRpcInvalidRequest(f"a message must be a JSON object, got {describe(data)}"))
            return
        if "method" not in data:
            self._receive_response(data)
            return
        method, is_request = data["method"], "id" in data
        if is_request and not valid_id(data["id"]):
            self.send_error(None, JsonRpcInvalidRequest(
                f"request id must be a string or an integer, got {describe(data['id'])}"))
            return
        problem = None
        if data.get("jsonrpc") != self.VERSION:
            problem = f'"jsonrpc" must be "2.0", got {describe(data.get("jsonrpc"))}'
        elif not isinstance(method, str):
            problem = f'"method" must be a string, got {describe(method)}'
        elif data.get("params") is not None and not isinstance(data["params"], (dict, list)):
            problem = f'"params" must be an object or an array, got {describe(data["params"])}'
        if problem is not None:
            if is_request:
                self.send_error(data["id"], JsonRpcInvalidRequest(problem))
            else:
                log.warning("dropped a notification: %s", problem)
            return
        if method == types.EXIT:
            self.exit_code = 0 if self.shutdown_received else 1
            return
        if not self._in_session(data, method, is_request):
            return
        if "params" not in data:
            data = {**data, "params": None}  # JSON-RPC: "This member MAY be omitted"
        message = self.structure_message(data)
        if message is not None:
            self.handle_message(message)

    def _in_session(self, data: dict[str, Any], method: str, is_request: bool) -> bool:
        """The life cycle check: whether this message may be handled now; answers it if not."""
        initialize = method == types.INITIALIZE and is_request
        if initialize and not self.initialize_received:
            self.initialize_received = True
            return True
        if initialize:
            refusal = JsonRpcInvalidRequest("initialize may only be sent once")
        elif not self.initialize_received:
            refusal = JsonRpcServerNotInitialized(f"{method}: the server is not initialized (send initialize first)")
        elif self.shutdown_received:
            refusal = JsonRpcInvalidRequest(f"{method}: the server has been shut down (only exit is accepted)")
        else:
            if method == types.SHUTDOWN and is_request:
                self.shutdown_received = True
            return True
        if is_request:
            self.send_error(data["id"], refusal)
        else:
            log.info("dropped a notification: %s", refusal.message)
        return False

    def _receive_response(self, data: dict[str, Any]) -> None:
        """An answer to a request the server sent (workspace/configuration, progress tokens)."""
        if not valid_id(data.get("id")) or ("result" not in data and "error" not in data):
            self.send_error(None, JsonRpcInvalidRequest(
                f"neither a request, a notification nor a response: {describe(data)}"))
            return
        message = self.structure_message(data)
        if message is not None:
            self.handle_message(message)

    def structure_message(self, data: dict[str, Any]):
        """The typed message for a JSON object, or None when its params do not fit its method: a
        request is then answered with InvalidParams (pygls would log it and leave the client waiting)."""
        try:
            if "method" in data:
                fallback = JsonRPCRequestMessage if "id" in data else JsonRPCNotification
                return self._converter.structure(data, self.get_message_type(data["method"]) or fallback)
            if "error" in data:
                return self._converter.structure(data, ResponseErrorMessage)
            response_type = self._result_types.pop(data["id"], None) or JsonRPCResponseMessage
            return self._converter.structure(data, response_type)
        except Exception as err:
            detail = "; ".join(cattrs.transform_error(err)) if isinstance(err, ClassValidationError) else str(err)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("unreadable message %s", describe(data, 2000), exc_info=True)
            if "method" in data and "id" in data:
                log.warning("invalid params for %s: %s", data["method"], detail)
                self.send_error(data["id"], JsonRpcInvalidParams(f"invalid params for {data['method']}: {detail}"))
            elif "method" in data:
                log.warning("dropped %s: invalid params: %s", data["method"], detail)
            else:
                log.warning("dropped an unreadable response to request %s: %s", data.get("id"), detail)
            return None

    # ---- handlers ------------------------------------------------------------------------------

    def _execute_handler(self, msg_id, handler, callback, args=None, kwargs=None):
        super()._execute_handler(msg_id, handler, callback, args, kwargs)
        # pygls files every handler's future under its message id so that $/cancelRequest can find
        # it, and removes it when it answers a request; notifications (and the steps of pygls' own
        # generator handlers) get made-up ids that nothing removes.
        future = self._request_futures.get(msg_id)
        if future is not None:
            def forget(done, msg_id=msg_id):
                if self._request_futures.get(msg_id) is done:
                    del self._request_futures[msg_id]
            future.add_done_callback(forget)

    def _handle_request(self, msg_id, method_name, params):
        if method_name in _COMPLETION_METHODS:
            doc = self._server.documents.get(params.text_document.uri)
            arrival_version.set(doc.version if doc is not None else None)
        super()._handle_request(msg_id, method_name, params)

    # Document sync: our DocumentStore holds the text. pygls' own copy is skipped: it splits lines
    # differently (see documents.py) and, clamping positions, edits the client's Position objects in
    # place before our handler reads them.
    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams):
        yield self.fm.features[types.TEXT_DOCUMENT_DID_OPEN], (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        yield self.fm.features[types.TEXT_DOCUMENT_DID_CHANGE], (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams):
        yield self.fm.features[types.TEXT_DOCUMENT_DID_CLOSE], (params,), None
