"""The server over stdio with the tiny model, as two kinds of editor see it:
a VS Code-like client (UTF-16 positions, inline completion) and a Neovim 0.11-like client (UTF-8
positions, no inline completion: it gets a completion item instead)."""
from __future__ import annotations

import asyncio
import re

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from decoding.models.weights import compute_dtype

from lsp_harness import (
    client_capabilities, custom_request, inline_params, insert_change, lsp_session, open_document,
    send_raw_request, stats, stats_until, units,
    wait_for_state,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Cursor inside auto-closed parentheses, after emoji (2 UTF-16 units, 4 UTF-8 bytes) and CJK
# (1 UTF-16 unit, 3 UTF-8 bytes): a server counting the wrong units lands somewhere else on the line.
NON_ASCII_BEFORE = 'greeting = format("😀 中文 🀄", '
NON_ASCII_AFTER = ")"
NON_ASCII_DOC = f"import sys\n\n\ndef main():\n    {NON_ASCII_BEFORE}{NON_ASCII_AFTER}\n    return 0\n"
NON_ASCII_LINE = 4
NON_ASCII_PREFIX = NON_ASCII_DOC[: NON_ASCII_DOC.index(NON_ASCII_BEFORE) + len(NON_ASCII_BEFORE)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vscode(tiny_model_dir, workspace):
    """A VS Code-like session: UTF-16, inline completion, progress bars."""
    async with lsp_session(["--target", str(tiny_model_dir)], workspace=workspace,
                           capabilities=client_capabilities(encodings=["utf-16"], inline=True)) as (client, init):
        client.init_result = init
        await wait_for_state(client)
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def neovim(tiny_model_dir, workspace):
    """A Neovim 0.11-like session: asks for UTF-8, has no inline completion, no progress support."""
    async with lsp_session(["--target", str(tiny_model_dir)], workspace=workspace,
                           capabilities=client_capabilities(encodings=["utf-8", "utf-16"], inline=False,
                                                            progress=False),
                           initialization_options={"maxTokens": 24, "temperature": "hot", "colour": 1}
                           ) as (client, init):
        client.init_result = init
        await wait_for_state(client)
        yield client


def doc_uri(workspace, name: str) -> str:
    return (workspace / name).as_uri()


# ---- initialize ---------------------------------------------------------------------------------

async def test_capabilities_are_advertised(vscode):
    caps = vscode.init_result.capabilities
    assert caps.inline_completion_provider is not None
    assert caps.completion_provider is not None
    assert set(caps.execute_command_provider.commands) == {"draftwise.accepted", "draftwise.partiallyAccepted"}
    assert caps.text_document_sync.change == types.TextDocumentSyncKind.Incremental
    assert caps.text_document_sync.open_close is True
    assert caps.position_encoding == types.PositionEncodingKind.Utf16
    assert vscode.init_result.server_info.name == "draftwise"


async def test_the_clients_preferred_encoding_is_negotiated(neovim):
    assert neovim.init_result.capabilities.position_encoding == types.PositionEncodingKind.Utf8
    assert (await stats(neovim))["positionEncoding"] == "utf-8"


async def test_initialization_options_apply_and_bad_values_are_explained_once(neovim):
    [message] = neovim.messages
    assert message.type == types.MessageType.Error
    assert "'temperature'" in message.message and "'hot'" in message.message
    s = await stats(neovim)
    assert s["state"] == "ready"  # a bad setting does not stop the server


async def test_model_loading_is_reported_with_work_done_progress(vscode):
    [(token, reports)] = vscode.progress_reports.items()
    kinds = [r.kind for r in reports]
    assert kinds[0] == "begin" and kinds[-1] == "end" and "report" in kinds
    percentages = [r.percentage for r in reports if r.kind == "report"]
    assert percentages == sorted(percentages) and percentages[-1] == 100
    assert reports[-1].message == "ready"


async def test_stats_describe_the_loaded_model(vscode, tiny_model_dir):
    s = await stats(vscode)
    assert s["state"] == "ready" and s["error"] is None
    assert s["target"] == str(tiny_model_dir)
    assert (s["device"], s["drafter"], s["draft"], s["draftLoaded"]) == ("cpu", "auto", None, False)
    assert s["fimTemplate"] == "qwen2.5-coder"
    # `auto` says what it chose and why; activations are bf16 for bf16 (and int4 on ATen's kernel)
    assert s["weights"] in ("fp32", "bf16", "int8", "int4", "gguf") and s["weightsReason"]
    assert s["dtype"] == str(compute_dtype(s["weights"])).removeprefix("torch.")
    assert set(s) >= {"last", "cumulative", "requests", "suggestions"}
    # whether drafting is lossless on the target's forward (the exactness probe's verdict)
    assert set(s["verify"]) == {"exact_width", "lossless", "exact"}
    assert s["verify"]["lossless"] == (s["verify"]["exact_width"] >= 2) == (s["draftingOff"] is None)
    # a model the quality gate never measured sees the rest of the cursor's line after the cursor
    assert s["suffix"]["lines"] is False and "not measured" in s["suffix"]["why"]


# ---- completions ----------------------------------------------------------------------------------

async def test_inline_completion_returns_a_suggestion_and_stats_count_it(vscode, workspace):
    uri = doc_uri(workspace, "fib.py")
    text = "def fibonacci(n):\n    if n < 2:\n        return n\n    return "
    open_document(vscode, uri, text)
    before = await stats(vscode)
    result = await vscode.text_document_inline_completion_async(inline_params(uri, 3, 11))
    [item] = result.items
    assert item.insert_text.strip()
    assert item.range.start == types.Position(line=3, character=11)
    assert item.command.command == "draftwise.accepted"
    after = await stats(vscode)
    assert after["requests"] == before["requests"] + 1
    assert after["last"]["generated_tokens"] >= 1 and after["last"]["stopped"] != "cancelled"
    assert after["suggestions"]["shown"] == before["suggestions"]["shown"] + 1


async def _position_round_trip(client, workspace, name: str, encoding: str, request):
    """Complete at a cursor after non-ASCII text, type the suggestion's first character there (in the
    client's units), and ask again one character later: the server answers from the suggestion on
    screen only if both positions meant the same place to it as to the client."""
    uri = doc_uri(workspace, name)
    open_document(client, uri, NON_ASCII_DOC)
    column = units("    " + NON_ASCII_BEFORE, encoding)
    info = await custom_request(client, "draftwise/documentText",
                                {"textDocument": {"uri": uri}, "position": {"line": NON_ASCII_LINE, "character": column}})
    assert info["offset"] == len(NON_ASCII_PREFIX)

    text, start = await request(uri, NON_ASCII_LINE, column)
    assert start == types.Position(line=NON_ASCII_LINE, character=column)
    assert text.strip(), "the tiny model gave no suggestion here; pick another cursor"

    typed = text[0]
    client.text_document_did_change(insert_change(uri, 2, NON_ASCII_LINE, column, typed))
    info = await custom_request(client, "draftwise/documentText", {"textDocument": {"uri": uri}})
    assert info["text"] == NON_ASCII_PREFIX + typed + NON_ASCII_DOC[len(NON_ASCII_PREFIX):]

    instant_before = (await stats(client))["suggestions"]["instant"]
    next_column = column + units(typed, encoding) if typed != "\n" else 0
    next_line = NON_ASCII_LINE + (typed == "\n")
    rest, _ = await request(uri, next_line, next_column)
    assert rest == text[1:]
    assert (await stats(client))["suggestions"]["instant"] == instant_before + 1


async def test_utf16_positions_on_a_line_with_emoji_and_cjk(vscode, workspace):
    async def request(uri, line, character):
        result = await vscode.text_document_inline_completion_async(inline_params(uri, line, character))
        [item] = result.items
        return item.insert_text, item.range.start

    await _position_round_trip(vscode, workspace, "utf16.py", "utf-16", request)


async def test_utf8_positions_and_a_completion_item_for_clients_without_inline_completion(neovim, workspace):
    async def request(uri, line, character):
        result = await neovim.text_document_completion_async(types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=character)))
        assert result.is_incomplete is True  # the client must ask again as the user types
        [item] = result.items
        assert item.command.command == "draftwise.accepted"
        return item.text_edit.new_text, item.text_edit.range.start

    await _position_round_trip(neovim, workspace, "utf8.py", "utf-8", request)


async def test_a_selected_popup_item_is_extended(vscode, workspace):
    uri = doc_uri(workspace, "selected.py")
    open_document(vscode, uri, "import os\n\nos.pa")
    params = inline_params(uri, 2, 5)
    params.context.selected_completion_info = types.SelectedCompletionInfo(
        range=types.Range(start=types.Position(line=2, character=3), end=types.Position(line=2, character=5)),
        text="path")
    result = await vscode.text_document_inline_completion_async(params)
    [item] = result.items
    # The client shows ghost text only when it starts with the selected item and replaces its range.
    assert item.insert_text.startswith("path") and len(item.insert_text) > len("path")
    assert item.range.start == types.Position(line=2, character=3)
    assert item.range.end == types.Position(line=2, character=5)


async def test_clients_with_inline_completion_get_no_duplicate_popup_item(vscode, workspace):
    uri = doc_uri(workspace, "popup.py")
    open_document(vscode, uri, "def f():\n    return ")
    result = await vscode.text_document_completion_async(types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=1, character=11)))
    assert not result.items


def client_edit(text: str, line: int, start: int, end: int, new: str) -> str:
    """An editor's own bookkeeping for one edit: LSP lines (only \\n, \\r\\n, \\r end them),
    columns in UTF-16 units."""
    line_starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]
    base = line_starts[line]

    def index(column: int) -> int:
        seen, i = 0, base
        while seen < column:
            seen += len(text[i].encode("utf-16-le")) // 2
            i += 1
        return i

    return text[: index(start)] + new + text[index(end):]


async def test_incremental_changes_keep_the_servers_text_equal_to_the_clients(vscode, workspace):
    uri = doc_uri(workspace, "sync.py")
    client_text = "a = '😀'\r\nb = '中'\n\x0cc = 3\n"
    open_document(vscode, uri, client_text)
    edits = [  # (line, start, end, new text), columns in UTF-16 units
        (0, 8, 8, " + '🀄'"),  # after the emoji (two units) and its closing quote
        (1, 0, 1, "bb"),
        (2, 1, 2, "C"),  # after the form feed, which does not end a line in LSP
        (0, 5, 7, ""),  # the emoji itself
        (3, 0, 0, "d = [\n    1,\n]\n"),
    ]
    for version, (line, start, end, new) in enumerate(edits, start=2):
        client_text = client_edit(client_text, line, start, end, new)
        vscode.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line=line, character=start),
                                  end=types.Position(line=line, character=end)), text=new)]))
    info = await custom_request(vscode, "draftwise/documentText", {"textDocument": {"uri": uri}})
    assert info["text"] == client_text == "a = '' + '🀄'\r\nbb = '中'\n\x0cC = 3\nd = [\n    1,\n]\n"
    assert info["version"] == len(edits) + 1


async def test_accepting_is_counted(vscode):
    before = (await stats(vscode))["suggestions"]
    await vscode.workspace_execute_command_async(types.ExecuteCommandParams(
        command="draftwise.accepted", arguments=[{"id": "1", "uri": "file:///x.py", "length": 12}]))
    await vscode.workspace_execute_command_async(types.ExecuteCommandParams(
        command="draftwise.partiallyAccepted", arguments=[{"id": "1", "uri": "file:///x.py", "acceptedLength": 3}]))
    after = (await stats(vscode))["suggestions"]
    assert after["accepted"] == before["accepted"] + 1
    assert after["partiallyAccepted"] == before["partiallyAccepted"] + 1
    assert after["acceptedChars"] == before["acceptedChars"] + 15


# ---- bad input --------------------------------------------------------------------------------

async def test_unreadable_params_get_an_invalid_params_error_and_the_server_keeps_going(vscode, workspace):
    with pytest.raises(JsonRpcException) as err:
        await send_raw_request(vscode, types.TEXT_DOCUMENT_INLINE_COMPLETION, {
            "textDocument": {"uri": doc_uri(workspace, "fib.py")}, "context": {"triggerKind": 1}})
    assert err.value.code == -32602 and "position" in err.value.message
    with pytest.raises(JsonRpcException) as err:
        await vscode.text_document_inline_completion_async(inline_params(doc_uri(workspace, "never-opened.py"), 0, 0))
    assert err.value.code == -32602 and "not open" in err.value.message
    with pytest.raises(JsonRpcException) as err:
        await vscode.workspace_execute_command_async(types.ExecuteCommandParams(
            command="draftwise.partiallyAccepted", arguments=["oops"]))
    assert err.value.code == -32602
    assert (await stats(vscode))["state"] == "ready"


async def test_configuration_changes_apply_and_bad_values_are_explained(vscode, workspace):
    shown = len(vscode.messages)
    vscode.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"draftwise": {"drafter": "lookup", "maxTokens": "lots", "colour": "blue"}}))
    message = await vscode.wait_for_notification(types.WINDOW_SHOW_MESSAGE)
    assert message.type == types.MessageType.Error
    assert "'maxTokens'" in message.message and "'lots'" in message.message
    assert len(vscode.messages) == shown + 1
    s = await stats(vscode)
    assert s["drafter"] == "lookup" and s["state"] == "ready"  # no reload for a drafter change

    vscode.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"draftwise": {"drafter": "auto", "languages": ["rust"]}}))
    uri = doc_uri(workspace, "not_rust.py")
    open_document(vscode, uri, "def f():\n    return ")
    result = await vscode.text_document_inline_completion_async(inline_params(uri, 1, 11))
    assert not result.items  # python is not among the configured languages
    vscode.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"draftwise": {"languages": None}}))
    await asyncio.sleep(0.1)
    assert (await stats(vscode))["drafter"] == "auto"


async def test_settings_are_pulled_when_the_client_only_says_they_changed(vscode):
    vscode.set_configuration({"drafter": "suggestion"}, section="draftwise")
    vscode.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
    for _ in range(100):
        if (await stats(vscode))["drafter"] == "suggestion":
            break
        await asyncio.sleep(0.05)
    assert (await stats(vscode))["drafter"] == "suggestion"
    vscode.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"draftwise": {"drafter": "auto"}}))



async def test_the_suffix_setting_shows_the_lines_after_the_cursor(tiny_model_dir, workspace):
    """`suffix: "lines"` puts the lines after the cursor into the prompt (within the suffix budget),
    `"line"` only the rest of the cursor's line, `"auto"` what was measured for the model (the tiny
    model never was: the line). A change reloads the engine, whose stats say what it shows."""
    text = "def area(w, h):\n    return w * h\n\n\nx = area(\nprint(x)\nprint(area(2, 3))\ny = x + 1\n"
    async with lsp_session(["--target", str(tiny_model_dir)], workspace=workspace,
                           capabilities=client_capabilities(encodings=["utf-16"], inline=True),
                           initialization_options={"idleWork": False, "suffix": "line"}) as (client, _):
        await wait_for_state(client)
        prompt_tokens = {}
        for shown in ("line", "lines", "auto"):
            if shown != "line":
                client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"suffix": shown}))
                await stats_until(client, lambda s: s["state"] == "ready" and s["suffix"] is not None
                                  and s["suffix"]["lines"] == (shown == "lines"), timeout=60)
            s = await stats(client)
            assert s["suffix"]["lines"] == (shown == "lines")
            assert ("as asked" if shown != "auto" else "not measured") in s["suffix"]["why"]
            uri = doc_uri(workspace, f"suffix_{shown}.py")  # a document of its own: nothing kept from another
            open_document(client, uri, text)
            await client.text_document_inline_completion_async(inline_params(uri, 4, 9))
            prompt_tokens[shown] = (await stats(client))["last"]["prompt_tokens"]
            # closed: an open document of the language would be the next one's context
            client.text_document_did_close(types.DidCloseTextDocumentParams(
                text_document=types.TextDocumentIdentifier(uri=uri)))
        # the lines after the cursor's line that fit 32 tokens, about a token a character in the tiny tokenizer
        assert prompt_tokens["lines"] > prompt_tokens["line"] + len("print(x)")
        assert prompt_tokens["auto"] == prompt_tokens["line"]
