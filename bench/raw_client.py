"""A byte-level LSP client for a real `draftwise serve` process over stdio.

The typed clients (pytest-lsp, pygls) cannot send a malformed frame, and they parse what the server
writes leniently. This one writes exactly the bytes it is given and reads stdout strictly: every byte
must belong to a `Content-Length` framed JSON-RPC 2.0 message. Anything else is recorded as a protocol
violation, which the tests assert never happens.

It also keeps the books the reliability tests need: which request ids were sent, every response that
came back for each id (to find requests answered twice or never), and the server's notifications;
`draftwise replay` reads from them when each answer arrived.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

REPO_ROOT = Path(__file__).resolve().parents[1]  # the server child imports this checkout
SERVE = [sys.executable, "-m", "lsp_server.cli", "serve"]

# Error codes a response may carry: JSON-RPC's reserved ones and LSP's (LSP 3.17, "Base Protocol").
JSONRPC_CODES = {-32700, -32600, -32601, -32602, -32603}
LSP_CODES = {-32002, -32001, -32800, -32801, -32802, -32803}
SERVER_ERROR_RANGE = range(-32099, -32000 + 1)  # JSON-RPC: "reserved for implementation-defined server-errors"

HEADER_FIELDS = {b"content-length", b"content-type"}


def valid_error_code(code: Any) -> bool:
    return isinstance(code, int) and not isinstance(code, bool) and (
        code in JSONRPC_CODES or code in LSP_CODES or code in SERVER_ERROR_RANGE)


def frame(body: bytes, *, content_type: bool = False) -> bytes:
    header = b"Content-Length: %d\r\n" % len(body)
    if content_type:
        header += b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n"
    return header + b"\r\n" + body


def encode(message: Any) -> bytes:
    """JSON as an editor writes it: UTF-8, non-ASCII characters unescaped."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")


def _not_json(constant: str) -> Any:
    # Python's json module reads NaN and Infinity; JSON has no such values.
    raise ValueError(f"{constant} is not JSON")


@dataclass
class Violation:
    what: str
    data: bytes

    def __str__(self) -> str:
        return f"{self.what}: {self.data[:200]!r}"


@dataclass
class Books:
    """What came back from the server, in arrival order."""
    responses: dict[Any, list[dict]] = field(default_factory=dict)  # id -> responses (JSON ids hashed as given)
    null_id_errors: list[dict] = field(default_factory=list)  # errors the server could not tie to a request
    notifications: list[dict] = field(default_factory=list)
    server_requests: list[dict] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    frames: int = 0
    arrivals: dict[Any, float] = field(default_factory=dict)  # id -> time.monotonic() of its first response


def _id_key(value: Any) -> str:
    # As JSON text: 1, "1", 1.0 and true are different ids (Python would treat 1, 1.0 and True as one
    # dict key), and a server may echo an id that is not hashable in Python (an object).
    return json.dumps(value, sort_keys=True)


class RawServer:
    """One server process. Use as a context manager; `close()` kills it if it is still running."""

    def __init__(self, args: Iterable[str], *, log_path: Path, env: dict[str, str] | None = None,
                 answer_server_requests: bool = True, command: list[str] | None = None) -> None:
        server_env = {**os.environ, **(env or {})}
        server_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
        server_env.setdefault("PYTHONUNBUFFERED", "1")
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen([*(command or SERVE), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._log, env=server_env, cwd=str(REPO_ROOT))
        self.books = Books()
        self.sent_request_ids: list[Any] = []
        self.answer_server_requests = answer_server_requests
        self.ending = False  # set once the test itself ends the session
        self.crashed = False
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self._eof = False
        self._reader = threading.Thread(target=self._read_loop, name="raw-lsp-reader", daemon=True)
        self._reader.start()

    # ---- context manager -----------------------------------------------------------------------

    def __enter__(self) -> "RawServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        # A process that ended although nobody asked it to (shutdown/exit, a closed pipe) crashed.
        self.crashed = self.crashed or (not self.ending and self.process.poll() is not None)
        self.ending = True
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        self._reader.join(timeout=10)
        self._log.close()

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_bytes().decode("utf-8", "replace")

    # ---- writing -------------------------------------------------------------------------------

    def send_bytes(self, data: bytes) -> None:
        with self._write_lock:
            self.process.stdin.write(data)
            self.process.stdin.flush()

    def send(self, message: Any) -> None:
        self.send_bytes(frame(encode(message)))

    def next_id(self) -> int:
        return next(self._ids)

    def request(self, method: str, params: Any = None, *, msg_id: Any = None) -> Any:
        """Send a request; returns its id (wait for the answer with `response`)."""
        msg_id = self.next_id() if msg_id is None else msg_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        self.expect_response(msg_id)
        self.send(message)
        return msg_id

    def expect_response(self, msg_id: Any) -> None:
        """Note a request id sent by other means (e.g. inside hand-made bytes)."""
        self.sent_request_ids.append(msg_id)

    def notify(self, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    def call(self, method: str, params: Any = None, timeout: float = 60.0) -> dict:
        """Request and wait: the whole response message."""
        return self.response(self.request(method, params), timeout)

    # ---- reading -------------------------------------------------------------------------------

    def responses_for(self, msg_id: Any) -> list[dict]:
        with self._cond:
            return list(self.books.responses.get(_id_key(msg_id), []))

    def response(self, msg_id: Any, timeout: float = 60.0) -> dict:
        """The (first) response to msg_id; raises TimeoutError if none comes in time."""
        deadline = time.monotonic() + timeout
        key = _id_key(msg_id)
        with self._cond:
            while not self.books.responses.get(key):
                left = deadline - time.monotonic()
                if left <= 0 or (self._eof and not self.books.responses.get(key)):
                    raise TimeoutError(f"no response to request {msg_id!r} after {timeout:.0f} s "
                                       f"(server {'exited' if self._eof else 'running'})")
                self._cond.wait(min(left, 0.5))
            return self.books.responses[key][0]

    def response_by(self, msg_id: Any, deadline: float) -> tuple[dict, float] | None:
        """The first response to msg_id and when it arrived (time.monotonic()), waiting until the
        monotonic `deadline` at most; None when it has not come by then."""
        key = _id_key(msg_id)
        with self._cond:
            while not self.books.responses.get(key):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if self._eof:
                    raise ConnectionError(f"the server exited before answering request {msg_id!r}")
                self._cond.wait(left)
            return self.books.responses[key][0], self.books.arrivals[key]

    def wait_for(self, predicate, timeout: float = 60.0, what: str = "condition") -> Any:
        """Wait until predicate(books) returns something truthy (called under the books' lock)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate(self.books)
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0 or self._eof:
                    raise TimeoutError(f"timed out waiting for {what}")
                self._cond.wait(min(left, 0.5))

    def unanswered(self, ids: Iterable[Any] | None = None) -> list[Any]:
        with self._cond:
            return [i for i in (self.sent_request_ids if ids is None else ids)
                    if not self.books.responses.get(_id_key(i))]

    def answered_twice(self) -> list[Any]:
        with self._cond:
            return [json.loads(key) for key, got in self.books.responses.items() if len(got) > 1]

    def unexpected_ids(self) -> list[Any]:
        """Responses to ids that were never sent as requests."""
        sent = {_id_key(i) for i in self.sent_request_ids}
        with self._cond:
            return [json.loads(key) for key in self.books.responses if key not in sent]

    def eof(self) -> bool:
        with self._cond:
            return self._eof

    def _violation(self, what: str, data: bytes) -> None:
        with self._cond:
            self.books.violations.append(Violation(what, data))

    def _read_exactly(self, n: int) -> bytes:
        try:
            out = self.process.stdout.read(n)
        except (OSError, ValueError):
            return b""
        return out if out is not None else b""

    def _read_loop(self) -> None:
        stdout = self.process.stdout
        try:
            while True:
                headers: dict[bytes, bytes] = {}
                raw_header = b""
                while True:
                    try:
                        line = stdout.readline()
                    except (OSError, ValueError):  # the test closed the pipe (a client going away)
                        return
                    if not line:
                        if raw_header:
                            self._violation("stdout ended inside a header", raw_header)
                        return
                    raw_header += line
                    if line == b"\r\n":
                        break
                    name, sep, value = line.partition(b":")
                    if not sep or not line.endswith(b"\r\n") or name.strip().lower() not in HEADER_FIELDS:
                        self._violation("not an LSP header line", line)
                        continue
                    headers[name.strip().lower()] = value.strip()
                length_text = headers.get(b"content-length", b"")
                if not length_text.isdigit():
                    self._violation("header without a valid Content-Length", raw_header)
                    continue
                body = self._read_exactly(int(length_text))
                if len(body) != int(length_text):
                    self._violation("stdout ended inside a body", body)
                    return
                try:
                    self._take(body)
                except Exception as err:  # a bug here must show up as a failure, not a silent hang
                    self._violation(f"client could not read the message ({type(err).__name__}: {err})", body)
        finally:
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def _take(self, body: bytes) -> None:
        try:
            message = json.loads(body.decode("utf-8"), parse_constant=_not_json)
        except (UnicodeDecodeError, ValueError):
            self._violation("body is not UTF-8 JSON", body)
            return
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            self._violation("not a JSON-RPC 2.0 message", body)
            return
        reply = None
        with self._cond:
            self.books.frames += 1
            if "method" in message:
                if not isinstance(message["method"], str):
                    self.books.violations.append(Violation("method is not a string", body))
                elif "id" in message:
                    self.books.server_requests.append(message)
                    reply = message["id"]
                else:
                    self.books.notifications.append(message)
            elif "id" in message:
                has_result, has_error = "result" in message, "error" in message
                if has_result == has_error:
                    self.books.violations.append(Violation("a response needs exactly one of result/error", body))
                elif has_error and not (isinstance(message["error"], dict)
                                        and valid_error_code(message["error"].get("code"))
                                        and isinstance(message["error"].get("message"), str)):
                    self.books.violations.append(Violation("error without a valid code and message", body))
                if message["id"] is None:
                    self.books.null_id_errors.append(message)
                else:
                    key = _id_key(message["id"])
                    self.books.responses.setdefault(key, []).append(message)
                    self.books.arrivals.setdefault(key, time.monotonic())
            else:
                self.books.violations.append(Violation("neither request, notification nor response", body))
            self._cond.notify_all()
        if reply is not None and self.answer_server_requests:
            try:
                # A server request (progress token, ...): an editor says yes.
                self.send({"jsonrpc": "2.0", "id": reply, "result": None})
            except (BrokenPipeError, ValueError, OSError):
                pass

    # ---- LSP helpers ---------------------------------------------------------------------------

    def initialize(self, workspace: Path, *, options: Any = None, encodings: list[str] | None = None,
                   progress: bool = False, timeout: float = 120.0) -> dict:
        capabilities: dict[str, Any] = {
            "textDocument": {"inlineCompletion": {}, "completion": {}, "synchronization": {}},
            "workspace": {"workspaceFolders": True},
            "window": {"workDoneProgress": progress},
        }
        if encodings:
            capabilities["general"] = {"positionEncodings": encodings}
        params = {"processId": os.getpid(), "rootUri": workspace.as_uri(), "capabilities": capabilities,
                  "workspaceFolders": [{"uri": workspace.as_uri(), "name": workspace.name}]}
        if options is not None:
            params["initializationOptions"] = options
        answer = self.call("initialize", params, timeout)
        self.notify("initialized", {})
        return answer

    def stats(self, timeout: float = 60.0) -> dict:
        answer = self.call("draftwise/stats", {}, timeout)
        if "result" not in answer:
            raise AssertionError(f"draftwise/stats failed: {answer}")
        return answer["result"]

    def wait_for_state(self, states: tuple[str, ...] = ("ready", "failed"), timeout: float = 180.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            current = self.stats()
            if current["state"] in states:
                return current
            if time.monotonic() > deadline:
                raise AssertionError(f"server still {current['state']!r} after {timeout:.0f} s: {current}")
            time.sleep(0.1)

    def open(self, uri: str, text: str, language: str = "python", version: int = 1) -> None:
        self.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": language,
                                                              "version": version, "text": text}})

    def inline(self, uri: str, line: int, character: int) -> Any:
        """Send an inline completion request; returns its id."""
        return self.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": uri}, "position": {"line": line, "character": character},
            "context": {"triggerKind": 2}})

    def shutdown_and_exit(self, timeout: float = 60.0) -> int:
        """The polite end of a session; returns the process's exit code."""
        answer = self.call("shutdown", None, timeout)
        if "error" in answer:
            raise AssertionError(f"shutdown failed: {answer}")
        self.ending = True
        self.notify("exit")
        return self.process.wait(timeout=timeout)
