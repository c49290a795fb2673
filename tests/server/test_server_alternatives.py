"""Alternatives on explicit invoke, partial accepts that the server uses, and the timing in stats,
through a real server process with the tiny model."""
from __future__ import annotations

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from lsp_harness import inline_params, inline_session, insert_change, open_document, stats, wait_for_state

pytestmark = pytest.mark.asyncio(loop_scope="module")

INVOKED = types.InlineCompletionTriggerKind.Invoked
TEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return "


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tiny_model_dir, workspace):
    # No time cap: the tests compare the greedy text of two requests, which a cap on a busy machine
    # could cut at different tokens.
    async with inline_session(tiny_model_dir, workspace, maxTokens=12, scope="full", maxTimeMs=0) as (client, _):
        await wait_for_state(client)
        yield client


def texts(result) -> list[str]:
    return [item.insert_text for item in result.items]


async def test_an_invoked_request_gets_distinct_alternatives_after_the_greedy_item(client, workspace):
    uri = (workspace / "alt.py").as_uri()
    open_document(client, uri, TEXT)
    automatic = await client.text_document_inline_completion_async(inline_params(uri, 3, 11))
    assert len(automatic.items) == 1, "automatic triggers stay one item"
    invoked = await client.text_document_inline_completion_async(inline_params(uri, 3, 11, trigger=INVOKED))
    assert len(invoked.items) == 3
    assert texts(invoked)[0] == texts(automatic)[0], "the greedy item comes first, unchanged"
    assert len(set(texts(invoked))) == 3
    ids = [item.command.arguments[0]["id"] for item in invoked.items]
    assert len(set(ids)) == 3, "each item is accepted (and counted) by its own id"
    assert all(item.range.start == types.Position(line=3, character=11) for item in invoked.items)
    counts = (await stats(client))["suggestions"]
    assert counts["alternativesShown"] >= 2


async def test_the_alternatives_setting_bounds_the_items(client, workspace):
    uri = (workspace / "alt-setting.py").as_uri()
    open_document(client, uri, TEXT)
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"alternatives": 1}))
    try:
        result = await client.text_document_inline_completion_async(inline_params(uri, 3, 11, trigger=INVOKED))
        assert len(result.items) == 1
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"alternatives": 0}))
        await client.wait_for_notification(types.WINDOW_SHOW_MESSAGE)
        assert "'alternatives'" in client.messages[-1].message
    finally:
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"alternatives": 3}))


async def test_a_partial_accept_of_an_alternative_makes_its_rest_the_next_answer(client, workspace):
    uri = (workspace / "partial.py").as_uri()
    open_document(client, uri, TEXT)
    invoked = await client.text_document_inline_completion_async(inline_params(uri, 3, 11, trigger=INVOKED))
    alternative = next(item for item in invoked.items[1:] if len(item.insert_text) >= 2)
    taken = alternative.insert_text[:1] if not alternative.insert_text[0].isspace() else alternative.insert_text[:2]
    before = (await stats(client))["suggestions"]
    await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="draftwise.partiallyAccepted",
        arguments=[{**alternative.command.arguments[0], "acceptedLength": len(taken), "kind": "word"}]))
    # The editor inserts what was taken; the next request comes from after it.
    client.text_document_did_change(insert_change(uri, 2, 3, 11, taken))
    after_typing = await client.text_document_inline_completion_async(inline_params(uri, 3, 11 + len(taken)))
    [item] = after_typing.items
    assert item.insert_text == alternative.insert_text[len(taken):]
    now = (await stats(client))["suggestions"]
    assert now["instant"] == before["instant"] + 1, "answered at once from the partly taken alternative"
    assert now["partiallyAcceptedBy"]["word"] == before["partiallyAcceptedBy"].get("word", 0) + 1
    assert now["alternativesAccepted"] == before["alternativesAccepted"] + 1
    assert now["acceptedChars"] == before["acceptedChars"] + len(taken)


async def test_bad_partial_accepts_are_refused_clearly_and_the_server_keeps_serving(client, workspace):
    uri = (workspace / "alt.py").as_uri()  # opened by the first test; it gets a suggestion there
    result = await client.text_document_inline_completion_async(inline_params(uri, 3, 11))
    argument = result.items[0].command.arguments[0]
    with pytest.raises(JsonRpcException) as err:
        await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="draftwise.partiallyAccepted", arguments=[{**argument, "acceptedLength": 1, "kind": "sentence"}]))
    assert err.value.code == -32602 and "'kind'" in err.value.message
    with pytest.raises(JsonRpcException) as err:
        await client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="draftwise.partiallyAccepted",
            arguments=[{**argument, "acceptedLength": len(result.items[0].insert_text) + 1}]))
    assert err.value.code == -32602 and "longer than" in err.value.message
    assert (await stats(client))["state"] == "ready"


async def test_stats_carry_the_last_suggestions_latency_and_speed(client, workspace):
    uri = (workspace / "timing.py").as_uri()
    open_document(client, uri, "import os\n\n\nclass Stack:\n    def push(self, item):\n        ")
    result = await client.text_document_inline_completion_async(inline_params(uri, 5, 8))
    assert result.items, "the tiny model suggests something here"
    s = await stats(client)
    timing, last = s["timing"], s["last"]  # the engine's last run is this suggestion's
    assert timing["latencyMs"] == pytest.approx(last["prefill_ms"] + last["decode_ms"], abs=0.2)
    assert timing["tokens"] == last["generated_tokens"] >= 1
    assert timing["acceptanceRate"] == last["acceptance_rate"]
    assert timing["tokensPerSecond"] == pytest.approx(last["generated_tokens"] * 1000 / last["decode_ms"], rel=0.01)
