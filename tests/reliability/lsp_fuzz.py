"""Hypothesis strategies for the traffic an editor (or a broken client) can send a language server.

Each strategy draws `Outgoing` messages: the exact bytes to write plus what the client may expect back
(a request needs exactly one answer; anything else needs none). The mix follows what goes wrong in
practice: half-typed documents with emoji, surrogate pairs, CJK, CRLF and tabs; positions past the end
or negative; edits with ranges that end before they start; requests for documents never opened;
settings of the wrong type; unknown methods; cancellations of ids that never existed; and bodies
that are not JSON at all.

Request ids are unique within a server session (`IdSource`), so "answered exactly once" can be
checked per id.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from raw_lsp import frame

# Kinds of outgoing message, and what each may get back.
REQUEST = "request"  # well-formed JSON-RPC request: exactly one response
NOTIFICATION = "notification"  # never a response
CLIENT_RESPONSE = "client-response"  # a response to a server request that was never made: ignored
GARBAGE = "garbage"  # not a JSON-RPC message: at most an error with a null id
ODD_ENVELOPE = "odd-envelope"  # JSON-RPC-ish with a broken envelope: at most one error response

TEXT_PIECES = [
    "def ", "return ", "class A:", "    ", "\t", "\n", "\r\n", "\r", "(", ")", "{", "}", "[", "]", "\"", "'",
    "x", "foo_bar", "1", ":", ";", ",", ".", "=", "# ", "//", "/*", "*/",
    "😀", "👩‍👩‍👧", "🇯🇵", "中文", "日本語", "한국어", "é", "e\u0301", "\u00a0", "\u200b", "\ufeff",
    "\u2028", "\u2029", "\x0c", "\x0b", "\x1c", "\x85", "\x00", "\x7f", "\U0010ffff", "\ud7ff", "\ue000",
]
LANGUAGES = ["python", "python", "rust", "typescript", "javascript", "go", "c", "plaintext", "", "PYTHON",
             "x" * 300, "日本語"]
SMALL_INTS = [-(2 ** 31) - 1, -(2 ** 31), -1, 0, 1, 2, 3, 5, 10, 100, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 53, 10 ** 30]
WRONG_TYPES = [None, True, False, 1.5, -0.0, "3", "", "x" * 100, [], [1, 2], {}, {"line": 1}, float("1e308")]
UNKNOWN_METHODS = ["textDocument/hover", "textDocument/definition", "textDocument/formatting", "foo", "",
                   "$/unknown", "draftwise/nope", "textDocument/inlineCompletion/extra", "../../etc/passwd",
                   "initialize ", "SHUTDOWN", "\u0000", "😀", "workspace/symbol"]
COMMANDS = ["draftwise.accepted", "draftwise.partiallyAccepted", "draftwise.unknown", "", "rm -rf /"]
# Settings that never trigger a model reload (a reload takes seconds; the reload path has its own tests).
SAFE_SETTING_VALUES = {
    "temperature": [0, 0.0, 0.7, 2, -1, 3, "hot", None, float("1e308")],
    "maxTokens": [1, 4, 8, 16, 0, -3, 4097, 2.5, "8", None, True],
    "scope": ["auto", "line", "block", "full", "word", 7, None],
    "languages": [None, None, ["python", "rust", "plaintext"], ["*"], ["rust", 3], "python", [""]],
    "drafter": ["auto", "lookup", "none", "suggestion", "model", "bogus", 1],
    # Engine keys with wrong types only: a valid new value would reload the model.
    "target": [5, [], {}, True, ""],
    "contextTokens": [1, -5, "lots", 10 ** 9, 1.5],
    "device": ["tpu", 0, None],
    "dtype": ["int4", 16],
}
MAX_TOKENS_IN_FUZZ = 8


@dataclass(frozen=True)
class Outgoing:
    data: bytes  # exactly what is written to the server's stdin
    kind: str
    msg_id: Any = None  # for requests: the id an answer must carry
    method: str = ""

    def describe(self) -> str:
        return f"{self.kind} {self.method or ''} {self.data[:160]!r}"


class IdSource:
    """Unique request ids for one server session, in both JSON types an id may have."""

    def __init__(self, start: int = 1_000_000) -> None:
        self._counter = itertools.count(start)

    def next(self, style: str) -> Any:
        n = next(self._counter)
        if style == "str":
            return f"fuzz-{n}"
        if style == "unicode":
            return f"id-😀-{n}"
        if style == "big":
            return 2 ** 40 + n
        return n


@dataclass(frozen=True)
class Places:
    """The directories the fuzz talks about."""
    workspace: Path
    outside: Path

    def uris(self) -> list[str]:
        ws, out = self.workspace.as_uri(), self.outside.as_uri()
        return [
            f"{ws}/a.py", f"{ws}/a.py", f"{ws}/b.py", f"{ws}/lib/c.rs", f"{ws}/%F0%9F%98%80%20space.py",
            f"{ws}/sub/../d.py", f"{ws}/../escape.py", f"{out}/secret.py", "untitled:Untitled-1",
            "file:///", "file://", "", "not a uri", "file:///%ZZ", "http://example.com/x.py",
            "file:///C:/Users/x/y.py", f"{ws}/" + "n" * 300 + ".py",
        ]


def _json_bytes(message: Any, ascii_only: bool) -> bytes:
    """JSON as editors write it: escaped to ASCII, or raw UTF-8. A lone surrogate has no UTF-8 form
    (invalid UTF-8 bodies come from the garbage strategy), so such messages always go escaped as
    \\udXXX: valid JSON whose string is not valid Unicode."""
    if not ascii_only:
        try:
            return json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        except UnicodeEncodeError:
            pass
    return json.dumps(message, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")


LONE_SURROGATES = ["\ud800", "\udfff", "\ud83d"]  # half an emoji, as a UTF-16 editor can hold


@st.composite
def document_text(draw, max_pieces: int = 60) -> str:
    piece = st.one_of(st.sampled_from(TEXT_PIECES), st.sampled_from(TEXT_PIECES), st.text(max_size=12))
    if draw(st.integers(0, 19)) == 0:
        piece = st.one_of(piece, st.sampled_from(LONE_SURROGATES))
    text = "".join(draw(st.lists(piece, max_size=max_pieces)))
    if draw(st.integers(0, 30)) == 0:
        text = text * draw(st.integers(10, 60))  # a few KB now and then
    return text


def position(draw) -> Any:
    choice = draw(st.integers(0, 15))
    if choice <= 11:
        return {"line": draw(st.integers(0, 12)), "character": draw(st.integers(0, 40))}
    if choice <= 13:
        return {"line": draw(st.sampled_from(SMALL_INTS)), "character": draw(st.sampled_from(SMALL_INTS))}
    if choice == 14:
        return {"line": draw(st.sampled_from(WRONG_TYPES)), "character": draw(st.integers(0, 5))}
    return draw(st.sampled_from([None, {}, {"line": 1}, [1, 2], "1:2", 5]))


def a_range(draw) -> Any:
    if draw(st.integers(0, 8)) == 0:
        return draw(st.sampled_from([None, {}, {"start": {"line": 0, "character": 0}}, [0, 0, 1, 1], "0:0-1:1"]))
    return {"start": position(draw), "end": position(draw)}


def maybe_break(draw, params: Any) -> Any:
    """Sometimes (one time in eight) damage params: drop a key, retype a value, add junk, or replace
    them whole. Most traffic stays well-formed so that it reaches the engine."""
    roll = draw(st.integers(0, 23))
    if roll >= 3 or not isinstance(params, dict):
        return params
    params = dict(params)
    keys = sorted(params)
    if roll == 0 and keys:
        params.pop(draw(st.sampled_from(keys)))
    elif roll == 1 and keys:
        params[draw(st.sampled_from(keys))] = draw(st.sampled_from(WRONG_TYPES))
    elif roll == 2:
        if draw(st.booleans()):
            params["extra😀"] = draw(st.sampled_from(WRONG_TYPES))
        else:
            return draw(st.sampled_from([None, 5, "params", [], [params], True]))
    return params


def request(msg_id: Any, method: str, params: Any, *, with_params: bool = True) -> dict:
    message = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if with_params:
        message["params"] = params
    return message


def notification(method: str, params: Any) -> dict:
    return {"jsonrpc": "2.0", "method": method, "params": params}


MESSAGE_KINDS = [
    "open", "open", "change", "change", "change", "close", "inline", "inline", "inline", "completion",
    "documentText", "stats", "command", "configuration", "cancel", "unknown-request",
    "unknown-notification", "workspace-folders", "trace", "client-response", "garbage", "odd-envelope",
    "initialize-again",
]


def lsp_messages(places: Places, ids: IdSource, *, recent_ids: list | None = None, leave_out: tuple[str, ...] = ()):
    """A strategy for one Outgoing message (requests get fresh ids from `ids`); leave_out names
    kinds of MESSAGE_KINDS not to send."""
    uris = places.uris()
    recent_ids = recent_ids if recent_ids is not None else []
    kinds = [k for k in MESSAGE_KINDS if k not in leave_out]

    @st.composite
    def one(draw) -> Outgoing:
        kind = draw(st.sampled_from(kinds))
        # Half the traffic is about two documents, so that edits and requests meet open documents.
        uri = draw(st.sampled_from(uris[:3] if draw(st.booleans()) else uris))
        ascii_only = draw(st.booleans())
        id_style = draw(st.sampled_from(["int", "int", "str", "unicode", "big"]))

        def req(method: str, params: Any) -> Outgoing:
            msg_id = ids.next(id_style)
            recent_ids.append(msg_id)
            del recent_ids[:-50]
            with_params = params is not None or draw(st.booleans())
            body = _json_bytes(request(msg_id, method, params, with_params=with_params), ascii_only)
            return Outgoing(body, REQUEST, msg_id, method)

        def note(method: str, params: Any) -> Outgoing:
            return Outgoing(_json_bytes(notification(method, params), ascii_only), NOTIFICATION, None, method)

        if kind == "open":
            return note("textDocument/didOpen", maybe_break(draw, {"textDocument": maybe_break(draw, {
                "uri": uri, "languageId": draw(st.sampled_from(LANGUAGES)),
                "version": draw(st.one_of(st.integers(0, 50), st.sampled_from(SMALL_INTS))),
                "text": draw(document_text())})}))
        if kind == "change":
            changes = []
            for _ in range(draw(st.integers(0, 4))):
                if draw(st.integers(0, 5)) == 0:
                    changes.append(maybe_break(draw, {"text": draw(document_text(20))}))  # whole document
                else:
                    change = {"range": a_range(draw), "text": draw(document_text(6))}
                    if draw(st.integers(0, 5)) == 0:
                        change["rangeLength"] = draw(st.sampled_from(SMALL_INTS))
                    changes.append(maybe_break(draw, change))
            return note("textDocument/didChange", maybe_break(draw, {
                "textDocument": {"uri": uri, "version": draw(st.one_of(st.integers(0, 10 ** 6), st.sampled_from(SMALL_INTS)))},
                "contentChanges": changes}))
        if kind == "close":
            return note("textDocument/didClose", maybe_break(draw, {"textDocument": {"uri": uri}}))
        if kind == "inline":
            context: dict[str, Any] = {"triggerKind": draw(st.sampled_from([1, 2] * 4 + [0, 3, -1, "1"]))}
            if draw(st.integers(0, 3)) == 0:
                context["selectedCompletionInfo"] = maybe_break(draw, {"range": a_range(draw),
                                                                      "text": draw(document_text(4))})
            return req("textDocument/inlineCompletion", maybe_break(draw, {
                "textDocument": {"uri": uri}, "position": position(draw), "context": maybe_break(draw, context)}))
        if kind == "completion":
            params = {"textDocument": {"uri": uri}, "position": position(draw)}
            if draw(st.booleans()):
                params["context"] = {"triggerKind": draw(st.sampled_from([1, 2, 3, 9])),
                                     "triggerCharacter": draw(st.sampled_from([".", "😀", "", "ab"]))}
            return req("textDocument/completion", maybe_break(draw, params))
        if kind == "documentText":
            params = {"textDocument": {"uri": uri}}
            if draw(st.booleans()):
                params["position"] = position(draw)
            return req("draftwise/documentText", maybe_break(draw, params))
        if kind == "stats":
            return req("draftwise/stats", draw(st.sampled_from([{}, None, [], {"x": 1}, 5])))
        if kind == "command":
            arguments = draw(st.sampled_from([
                [{"id": "1", "uri": uri, "length": 3}], [{"id": "2", "acceptedLength": 2}], [],
                [{"id": 5}], [{"id": "3", "acceptedLength": -1}], [{"id": "4", "acceptedLength": True}],
                None, "x", [1, 2, 3], [{"id": "5", "length": 10 ** 30}]]))
            params: dict[str, Any] = {"command": draw(st.sampled_from(COMMANDS))}
            if arguments is not None:
                params["arguments"] = arguments
            return req("workspace/executeCommand", maybe_break(draw, params))
        if kind == "configuration":
            keys = draw(st.lists(st.sampled_from(sorted(SAFE_SETTING_VALUES)), max_size=4, unique=True))
            values = {k: draw(st.sampled_from(SAFE_SETTING_VALUES[k])) for k in keys}
            if "maxTokens" in values and isinstance(values["maxTokens"], int) and values["maxTokens"] > MAX_TOKENS_IN_FUZZ:
                values["maxTokens"] = MAX_TOKENS_IN_FUZZ + 1  # still valid; keeps completions short
            if draw(st.booleans()):
                values[draw(st.sampled_from(["mystery", "", "😀"]))] = draw(st.sampled_from(WRONG_TYPES))
            settings = draw(st.sampled_from([{"draftwise": values}, values, None, 5, "x", [values]]))
            return note("workspace/didChangeConfiguration", maybe_break(draw, {"settings": settings}))
        if kind == "cancel":
            # Draw the same choices whatever the session's history (hypothesis replays draws).
            use_recent, pick = draw(st.booleans()), draw(st.integers(0, 49))
            made_up = draw(st.sampled_from([0, -1, "nope", 10 ** 12, None, 1.5, {}]))
            target = recent_ids[-1 - pick % len(recent_ids)] if use_recent and recent_ids else made_up
            return note("$/cancelRequest", maybe_break(draw, {"id": target}))
        if kind == "unknown-request":
            return req(draw(st.sampled_from(UNKNOWN_METHODS)), draw(st.sampled_from([{}, None, [], {"a": 1}])))
        if kind == "unknown-notification":
            return note(draw(st.sampled_from(UNKNOWN_METHODS + ["textDocument/didSave", "textDocument/willSave",
                                                                "$/progress", "window/workDoneProgress/cancel"])),
                        draw(st.sampled_from([{}, None, [], {"token": "x"}, 3])))
        if kind == "workspace-folders":
            folder = {"uri": draw(st.sampled_from([places.workspace.as_uri(), places.outside.as_uri(), "file:///", "x"])),
                      "name": "w"}
            return note("workspace/didChangeWorkspaceFolders", maybe_break(draw, {"event": {
                "added": draw(st.sampled_from([[folder], [], "x"])), "removed": draw(st.sampled_from([[folder], []]))}}))
        if kind == "trace":
            return note("$/setTrace", {"value": draw(st.sampled_from(["off", "messages", "verbose", "loud", 1]))})
        if kind == "client-response":
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": draw(st.sampled_from([1, "x", 10 ** 9, -5]))}
            if draw(st.booleans()):
                reply["result"] = draw(st.sampled_from([None, {}, [1], "ok"]))
            else:
                reply["error"] = {"code": draw(st.sampled_from([-32601, 1, 0])), "message": "no"}
            return Outgoing(_json_bytes(reply, ascii_only), CLIENT_RESPONSE)
        if kind == "garbage":
            return Outgoing(draw(garbage_body()), GARBAGE)
        if kind == "odd-envelope":
            return draw(odd_envelope(ids))
        # A second initialize: clients must not, but a server must not fall over (and stays usable).
        capabilities = draw(st.sampled_from([
            {}, {"textDocument": {"inlineCompletion": {}}}, {"textDocument": {"completion": {}}},
            {"general": {"positionEncodings": ["utf-8"]}, "textDocument": {"inlineCompletion": {}}},
            {"general": {"positionEncodings": ["utf-32", "utf-16"]}}, "caps", None]))
        params = {"processId": draw(st.sampled_from([None, 1, -1])), "rootUri": places.workspace.as_uri(),
                  "capabilities": capabilities,
                  "initializationOptions": draw(st.sampled_from([None, {"maxTokens": 4}, "x", {"scope": "line"}]))}
        return req("initialize", maybe_break(draw, params))

    return one()


@st.composite
def garbage_body(draw) -> bytes:
    return draw(st.one_of(
        st.binary(max_size=200),
        st.sampled_from([
            b"", b"{", b"}", b"{not json}", b"null", b"42", b'"string"', b"[]", b"[1, 2, 3]", b"true",
            b'{"jsonrpc": "2.0", "id": 1, "method": "x", "params": {', b"\xff\xfe\xfd",
            b'{"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"text": "\xc3\x28"}}',
            b"[" * 5000 + b"]" * 5000, b'{"a":' * 3000 + b"1" + b"}" * 3000,
            b'[{"jsonrpc": "2.0", "method": "initialized", "params": {}}]',  # a batch: not part of LSP
            b"\x00" * 64, "😀".encode("utf-16-le"), b'{"jsonrpc": "2.0", "method": NaN}',
            # an id that Python reads as infinity, whose echo would not be JSON
            b'{"jsonrpc": "2.0", "id": 1e400, "method": "draftwise/stats", "params": {}}',
        ]),
        st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")),
    ))


@st.composite
def odd_envelope(draw, ids: IdSource) -> Outgoing:
    msg_id = ids.next("int")
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": "draftwise/stats", "params": {}}
    damage = draw(st.sampled_from(["no-jsonrpc", "jsonrpc-1", "jsonrpc-num", "method-num", "method-null",
                                   "params-scalar", "result-and-method", "odd-id"]))
    if damage == "no-jsonrpc":
        del message["jsonrpc"]
    elif damage == "jsonrpc-1":
        message["jsonrpc"] = "1.0"
    elif damage == "jsonrpc-num":
        message["jsonrpc"] = 2.0
    elif damage == "method-num":
        message["method"] = 5
    elif damage == "method-null":
        message["method"] = None
    elif damage == "params-scalar":
        message["params"] = draw(st.sampled_from([5, "x", True]))
    elif damage == "result-and-method":
        message["result"] = None
    else:
        # JSON-RPC ids are strings or numbers; these are neither (or a fraction, or null). Unique
        # so that an echo can be matched; the answer has id null.
        message["id"] = draw(st.sampled_from([msg_id + 0.5, [msg_id], {"n": msg_id}, None]))
    return Outgoing(json.dumps(message).encode(), ODD_ENVELOPE, message["id"], f"odd:{damage}")


@dataclass(frozen=True)
class Write:
    data: bytes
    await_id: Any = None  # after this write, wait for the answer to this request (as an editor
    # waiting for a completion before the next key does); None: go straight on


@st.composite
def writes(draw, messages: list[Outgoing]) -> list[Write]:
    """How the frames reach the pipe: one write each, several per write, or one split in two; now
    and then the client waits for a request's answer before it writes on."""
    out: list[Write] = []
    pending = b""
    for message in messages:
        data = frame(message.data, content_type=draw(st.integers(0, 4)) == 0)
        how = draw(st.integers(0, 5))
        # Drawn whatever the message's length (which depends on ids from the session's counter):
        # hypothesis needs the same choices to give the same draws.
        cut_at = draw(st.floats(0.0, 1.0))
        if how == 0:
            pending += data  # glued to the next frame
            continue
        data, pending = pending + data, b""
        if how == 1 and len(data) > 2:
            cut = min(max(1, int(len(data) * cut_at)), len(data) - 1)
            out += [Write(data[:cut]), Write(data[cut:])]
        elif how == 2 and message.kind == REQUEST:
            out.append(Write(data, await_id=message.msg_id))
        else:
            out.append(Write(data))
    if pending:
        out.append(Write(pending))
    return out
