"""The edges of the protocol, one at a time, against the real server process: the session's life cycle
(before initialize, after shutdown, exit), JSON-RPC envelopes the spec allows but clients rarely send,
headers, and documents that are huge or hold text a tokenizer cannot read.

pygls alone gets several of these wrong; lsp_server/protocol.py and lsp_server/transport.py hold
what the server does instead, and each test here names the rule it checks.
"""
from __future__ import annotations

import json
import time

import pytest

from raw_lsp import encode, frame
from reliability_support import tiny_args

PARSE_ERROR = -32700
SERVER_NOT_INITIALIZED = -32002
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601


def started(start_server, tiny_model_dir, places, **options):
    workspace, _ = places
    server = start_server(tiny_args(tiny_model_dir))
    server.initialize(workspace, options=options or None)
    return server


# ---- life cycle ----------------------------------------------------------------------------------

def test_requests_before_initialize_get_server_not_initialized(start_server, tiny_model_dir, places):
    server = start_server(tiny_args(tiny_model_dir))
    ids = [server.request("draftwise/stats", {}),
           server.request("textDocument/inlineCompletion", {"textDocument": {"uri": "file:///a.py"},
                                                            "position": {"line": 0, "character": 0},
                                                            "context": {"triggerKind": 1}}),
           server.request("workspace/executeCommand", {"command": "draftwise.accepted", "arguments": [{"id": "1"}]})]
    codes = [server.response(i, 30).get("error", {}).get("code") for i in ids]
    assert codes == [SERVER_NOT_INITIALIZED] * 3, codes


def test_configuration_before_initialize_does_not_wedge_loading(start_server, tiny_model_dir, places):
    workspace, _ = places
    server = start_server(tiny_args(tiny_model_dir))
    server.notify("workspace/didChangeConfiguration", {"settings": {"draftwise": {"maxTokens": 8}}})
    server.initialize(workspace)
    assert server.wait_for_state(timeout=20)["state"] == "ready"


def test_requests_after_shutdown_get_invalid_request(start_server, tiny_model_dir, places):
    workspace, _ = places
    server = started(start_server, tiny_model_dir, places)
    assert "error" not in server.call("shutdown")
    ids = [server.request("draftwise/stats", {}), server.request("initialize", {
        "processId": None, "rootUri": workspace.as_uri(), "capabilities": {}})]
    try:
        codes = [server.response(i, 5).get("error", {}).get("code") for i in ids]
    finally:
        server.ending = True
        server.notify("exit")
    assert server.process.wait(timeout=30) == 0
    assert codes == [INVALID_REQUEST] * 2, codes


def test_notifications_before_initialize_are_dropped(start_server, tiny_model_dir, places):
    """LSP: a notification before initialize "should be dropped" (exit excepted)."""
    workspace, _ = places
    server = start_server(tiny_args(tiny_model_dir))
    server.open((workspace / "early.py").as_uri(), "x = 1\n")
    server.initialize(workspace)
    assert server.stats()["openDocuments"] == 0
    server.open((workspace / "later.py").as_uri(), "x = 1\n")
    assert server.stats()["openDocuments"] == 1


def test_a_second_initialize_is_an_invalid_request(start_server, tiny_model_dir, places):
    workspace, _ = places
    server = started(start_server, tiny_model_dir, places)
    again = server.call("initialize", {"processId": None, "rootUri": workspace.as_uri(), "capabilities": {}})
    assert again.get("error", {}).get("code") == INVALID_REQUEST, again
    assert "result" in server.call("draftwise/stats", {})  # the session goes on


def test_exit_after_shutdown_exits_with_0(start_server, tiny_model_dir, places):
    assert started(start_server, tiny_model_dir, places).shutdown_and_exit() == 0


def test_exit_without_shutdown_exits_with_1(start_server, tiny_model_dir):
    """LSP: "The server should exit with success code 0 if the shutdown request has been received
    before; otherwise with error code 1"."""
    server = start_server(tiny_args(tiny_model_dir))
    server.ending = True
    server.notify("exit")
    assert server.process.wait(timeout=60) == 1


@pytest.mark.parametrize("shut_down", [True, False], ids=["after-shutdown", "without-shutdown"])
def test_a_client_that_closes_the_connection_gets_the_exit_code_of_exit(start_server, tiny_model_dir, places,
                                                                         shut_down):
    server = started(start_server, tiny_model_dir, places)
    if shut_down:
        assert "error" not in server.call("shutdown")
    server.ending = True
    server.process.stdin.close()
    assert server.process.wait(timeout=60) == (0 if shut_down else 1)


# ---- JSON-RPC envelopes --------------------------------------------------------------------------

def test_null_id_is_answered_with_a_null_id(start_server, tiny_model_dir, places):
    server = started(start_server, tiny_model_dir, places)
    server.send(json.loads('{"jsonrpc": "2.0", "id": null, "method": "draftwise/nope", "params": {}}'))
    server.stats()
    time.sleep(0.5)
    assert not server.books.violations, [str(v) for v in server.books.violations]
    assert len(server.books.null_id_errors) == 1


def test_an_infinite_id_does_not_put_invalid_json_on_stdout(start_server, tiny_model_dir, places):
    server = started(start_server, tiny_model_dir, places)
    server.send_bytes(frame(b'{"jsonrpc": "2.0", "id": 1e400, "method": "draftwise/stats", "params": {}}'))
    server.stats()
    time.sleep(0.5)
    assert not server.books.violations, [str(v) for v in server.books.violations]


def test_params_may_be_omitted(start_server, tiny_model_dir, places):
    server = started(start_server, tiny_model_dir, places)
    stats = server.response(server.request("draftwise/stats"))
    unknown = server.response(server.request("draftwise/nope"))
    assert "result" in stats, stats
    assert unknown.get("error", {}).get("code") == METHOD_NOT_FOUND, unknown


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe\x00", b'{"jsonrpc": "2.0", "id": 5, "method": NaN}',
                                  b"[" * 100_000 + b"]" * 100_000], ids=["syntax", "bytes", "nan", "deep"])
def test_an_unparsable_body_is_answered_with_parse_error(start_server, tiny_model_dir, places, body):
    """JSON-RPC: invalid JSON gets -32700 with id null; the session goes on."""
    server = started(start_server, tiny_model_dir, places)
    server.send_bytes(frame(body))
    server.wait_for(lambda books: books.null_id_errors, 10, "a parse error")
    assert [e["error"]["code"] for e in server.books.null_id_errors] == [PARSE_ERROR]
    assert "result" in server.call("draftwise/stats", {})
    assert not server.books.violations


@pytest.mark.parametrize("message", [[], [{"jsonrpc": "2.0", "id": 1, "method": "draftwise/stats"}], 42,
                                     {"jsonrpc": "2.0"}, {"jsonrpc": "2.0", "id": 7}])
def test_what_is_no_message_is_an_invalid_request(start_server, tiny_model_dir, places, message):
    server = started(start_server, tiny_model_dir, places)
    server.send(message)
    server.wait_for(lambda books: books.null_id_errors, 10, "an invalid request error")
    assert [e["error"]["code"] for e in server.books.null_id_errors] == [INVALID_REQUEST]
    assert "result" in server.call("draftwise/stats", {})


@pytest.mark.parametrize("envelope", [{"jsonrpc": "1.0"}, {"method": 5}, {"params": 3}])
def test_a_request_with_a_bad_envelope_is_an_invalid_request(start_server, tiny_model_dir, places, envelope):
    server = started(start_server, tiny_model_dir, places)
    message = {"jsonrpc": "2.0", "id": 950, "method": "draftwise/stats", "params": {}, **envelope}
    server.expect_response(950)
    server.send(message)
    assert server.response(950, 10)["error"]["code"] == INVALID_REQUEST


# ---- headers -------------------------------------------------------------------------------------

def test_extra_headers_in_any_order(start_server, tiny_model_dir, places):
    server = started(start_server, tiny_model_dir, places)
    body = encode({"jsonrpc": "2.0", "id": 900, "method": "draftwise/stats", "params": {}})
    server.expect_response(900)
    server.send_bytes(b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert "result" in server.response(900, 30)


def test_header_name_case_does_not_matter(start_server, tiny_model_dir, places):
    server = started(start_server, tiny_model_dir, places)
    body = encode({"jsonrpc": "2.0", "id": 901, "method": "draftwise/stats", "params": {}})
    server.expect_response(901)
    server.send_bytes(b"content-length: %d\r\n\r\n" % len(body) + body)
    assert "result" in server.response(901, 5)


def test_a_bad_header_loses_only_its_own_message(start_server, tiny_model_dir, places):
    server = started(start_server, tiny_model_dir, places)
    server.send_bytes(b"Content-Length: twelve\r\n\r\n" + encode({"jsonrpc": "2.0", "method": "x", "params": {}}))
    later = server.request("draftwise/stats", {})
    assert "result" in server.response(later, 5)


def test_header_junk_before_a_message_is_skipped(start_server, tiny_model_dir, places):
    """A client that wrote a body without a header: the next message still gets through."""
    server = started(start_server, tiny_model_dir, places)
    body = encode({"jsonrpc": "2.0", "id": 902, "method": "draftwise/stats", "params": {}})
    server.expect_response(902)
    server.send_bytes(b'{"jsonrpc": "2.0", "method": "x"}' + frame(body))
    assert "result" in server.response(902, 5)


@pytest.mark.parametrize("length", [b"99999999999999", b"9" * 5000, b" 12 x"])
def test_an_unusable_content_length_is_skipped(start_server, tiny_model_dir, places, length):
    server = started(start_server, tiny_model_dir, places)
    server.send_bytes(b"Content-Length: " + length + b"\r\n\r\n")
    later = server.request("draftwise/stats", {})
    assert "result" in server.response(later, 5)


# ---- documents -----------------------------------------------------------------------------------

def big_text(size: int) -> str:
    unit = "def f(x):\n    return x + 1  # 😀 中文\r\n\tpass\n"
    return (unit * (size // len(unit) + 1))[:size]


def test_ten_megabyte_document_is_kept(start_server, tiny_model_dir, places):
    """Open, edit and read back a 10 MB document (no completion: see the test below)."""
    workspace, _ = places
    server = started(start_server, tiny_model_dir, places)
    assert server.wait_for_state()["state"] == "ready"  # (shutdown mid-load has its own test)
    uri = (workspace / "big.py").as_uri()
    text = big_text(10_000_000)
    began = time.monotonic()
    server.open(uri, text)
    server.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [
        {"range": {"start": {"line": 250_000, "character": 0}, "end": {"line": 250_000, "character": 0}},
         "text": "# inserted 🚀\n"}]})
    copy = server.call("draftwise/documentText", {"textDocument": {"uri": uri}}, timeout=60)["result"]
    lines = text.replace("\r\n", "\n").split("\n")
    assert copy["version"] == 2 and len(copy["text"]) == len(text) + len("# inserted 🚀\n")
    assert copy["text"].replace("\r\n", "\n").split("\n")[250_000] == "# inserted 🚀"
    assert copy["text"].replace("\r\n", "\n").split("\n")[250_001] == lines[250_000]
    assert time.monotonic() - began < 30
    server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert server.stats()["openDocuments"] == 0
    assert server.shutdown_and_exit() == 0


def complete_in_time(server, uri: str, line: int, character: int, seconds: float) -> None:
    """A completion answered within `seconds`, by the engine (not an empty answer from an error)."""
    before = server.stats()["requests"]
    answer = server.response(server.inline(uri, line, character), seconds)
    assert "result" in answer, answer
    assert server.stats()["requests"] == before + 1, "the engine did not complete the request"


# The prompt keeps only the text near the cursor, so a file's size must not show in the time a
# completion takes (a suffix fitted line by line once took minutes for 100 KB).
def ready_with_document(start_server, tiny_model_dir, places, name: str, size: int):
    """A ready server (4-token completions) with a document of `size` characters open; (server, uri)."""
    workspace, _ = places
    server = started(start_server, tiny_model_dir, places, maxTokens=4)
    assert server.wait_for_state()["state"] == "ready"
    uri = (workspace / name).as_uri()
    server.open(uri, big_text(size))
    return server, uri


def test_completion_near_the_top_of_a_100_kb_file(start_server, tiny_model_dir, places):
    server, uri = ready_with_document(start_server, tiny_model_dir, places, "long.py", 100_000)
    complete_in_time(server, uri, 3, 0, 10)
    assert server.shutdown_and_exit() == 0


@pytest.mark.slow
def test_completions_in_a_ten_megabyte_document(start_server, tiny_model_dir, places):
    server, uri = ready_with_document(start_server, tiny_model_dir, places, "huge.py", 10_000_000)
    for line in (0, 400_000, 749_999):  # top, middle, last line
        complete_in_time(server, uri, line, 0, 30)  # a line start: mid-word positions get no suggestion
    assert server.shutdown_and_exit() == 0


# A UTF-16 editor can hold half a surrogate pair and send it as JSON \ud800; the tokenizer cannot
# take such a string, which once made every completion in the document fail.
def test_a_lone_surrogate_does_not_disable_completions(start_server, tiny_model_dir, places):
    workspace, _ = places
    server = started(start_server, tiny_model_dir, places, maxTokens=4)
    assert server.wait_for_state()["state"] == "ready"
    uri = (workspace / "half_emoji.py").as_uri()
    text = "label = 'half an emoji: \ud83d'\n\ndef area(r):\n    return "
    server.send_bytes(frame(json.dumps({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {
        "textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}}}).encode()))
    complete_in_time(server, uri, 3, 11, 60)
    assert server.shutdown_and_exit() == 0
