"""Idle work through a real server process with the tiny model: the suggestion started while the user
pauses (the editor's request joins it), the prompt read ahead where no suggestion is asked for, the
next suggestion prefetched after one is shown, no generation mid-word, and the time cap."""
from __future__ import annotations

import asyncio
import time

import pytest
import pytest_asyncio
from lsprotocol import types

from lsp_harness import (
    inline_params, inline_session, insert_change, lsp_session, open_document, stats, stats_until, wait_for_state,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

TEXT = "import os\n\n\ndef list_files(root):\n    names = []\n    for entry in os.listdir(root):\n        "
LAST_LINE, LAST_COLUMN = 6, 8


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tiny_model_dir, workspace):
    async with inline_session(tiny_model_dir, workspace, maxTokens=10, scope="full") as (client, _):
        await wait_for_state(client)
        yield client


async def settled(client) -> dict:
    """Stats once the earlier tests' idle work is over (nothing running, no idle count changed for 0.3 s)."""
    current = await stats(client)
    for _ in range(100):
        await asyncio.sleep(0.3)
        previous, current = current, await stats(client)
        if previous["idle"] == current["idle"] and current["running"] is None:
            return current
    raise AssertionError(f"idle work never settled: {current['idle']}")


async def test_no_generation_inside_a_word_unless_invoked(client, workspace):
    uri = (workspace / "mid-word.py").as_uri()
    open_document(client, uri, "value = compute(other)\n")
    before = await stats(client)  # first in this module: no background work is running yet
    automatic = await client.text_document_inline_completion_async(inline_params(uri, 0, 3))  # va|lue
    after = await stats(client)
    assert automatic is None or not automatic.items
    assert after["suggestions"]["skippedMidWord"] == before["suggestions"]["skippedMidWord"] + 1
    assert after["requests"] == before["requests"], "the engine did not run"
    invoked = await client.text_document_inline_completion_async(
        inline_params(uri, 0, 3, trigger=types.InlineCompletionTriggerKind.Invoked))
    assert (await stats(client))["requests"] == before["requests"] + 1
    assert invoked is not None


async def test_typing_starts_the_suggestion_and_the_editors_request_is_answered_from_it(client, workspace):
    uri = (workspace / "typed.py").as_uri()
    open_document(client, uri, TEXT)
    # Settled: the suggestion the test before showed is prefetched in the background, and that
    # prefetch ending after `before` would pass the wait below before this edit's job even started.
    before = await settled(client)
    client.text_document_did_change(insert_change(uri, 2, LAST_LINE, LAST_COLUMN, "n"))
    # The suggestion at the end of the edit was computed in the quiet period, before the editor asked
    # (and, cut by maxTokens, the link after it too).
    await stats_until(client, lambda s: s["idle"]["prefetches"] > before["idle"]["prefetches"])
    ready = await settled(client)
    assert ready["idle"]["prefetches"] == before["idle"]["prefetches"] + 2
    result = await client.text_document_inline_completion_async(inline_params(uri, LAST_LINE, LAST_COLUMN + 1))
    assert result is not None and result.items
    after = await stats(client)
    assert after["suggestions"]["predicted"] == before["suggestions"]["predicted"] + 1, "idle work's answer"
    assert after["requests"] == before["requests"], "the engine was not asked again"
    # The statusline's timing is that of the idle job behind the text on screen (before: the
    # previous test's invoked request).
    assert after["timing"] != before["timing"] and after["timing"]["tokens"] >= 1 and after["timing"]["latencyMs"] > 0


async def test_an_edit_inside_a_word_reads_the_prompt_ahead_and_the_request_reuses_it(client, workspace):
    uri = (workspace / "mid-word-typed.py").as_uri()
    open_document(client, uri, "names = sorted(entries)\n")
    before = await settled(client)
    client.text_document_did_change(insert_change(uri, 2, 0, 3, "e"))  # nam|es: no suggestion there
    await stats_until(client, lambda s: s["idle"]["prepared_tokens"] > before["idle"]["prepared_tokens"])
    assert (await stats(client))["idle"]["prefetches"] == before["idle"]["prefetches"], "nothing generated"
    invoked = await client.text_document_inline_completion_async(
        inline_params(uri, 0, 4, trigger=types.InlineCompletionTriggerKind.Invoked))
    assert invoked is not None
    last = (await stats(client))["last"]
    # Everything but the last prompt token was read while the user paused (the request sends that one).
    assert last["reused_prompt_tokens"] == last["prompt_tokens"] - 1


async def test_without_idle_work_nothing_is_read_ahead(client, workspace):
    uri = (workspace / "not-ahead.py").as_uri()
    open_document(client, uri, TEXT)
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"idleWork": False}))
    try:
        before = (await settled(client))["idle"]
        client.text_document_did_change(insert_change(uri, 2, LAST_LINE, LAST_COLUMN, "n"))
        await asyncio.sleep(0.5)  # ten quiet periods
        after = (await stats(client))["idle"]
        assert after["read_aheads"] == before["read_aheads"] and after["prefetches"] == before["prefetches"]
    finally:
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"idleWork": True}))


async def test_after_a_suggestion_is_shown_the_next_one_is_ready_when_it_is_accepted(client, workspace):
    uri = (workspace / "prefetch.py").as_uri()
    open_document(client, uri, TEXT)
    before = (await stats(client))["suggestions"]
    shown = await client.text_document_inline_completion_async(inline_params(uri, LAST_LINE, LAST_COLUMN))
    text = shown.items[0].insert_text
    assert text and "\n" not in text, "the tiny model's suggestion must stay on the line for this test"
    await stats_until(client, lambda s: s["suggestions"]["prefetched"] > before["prefetched"])
    # The user takes it (Tab): the editor inserts it and asks again at its end.
    client.text_document_did_change(insert_change(uri, 2, LAST_LINE, LAST_COLUMN, text))
    command = shown.items[0].command
    await client.workspace_execute_command_async(types.ExecuteCommandParams(command=command.command,
                                                                            arguments=command.arguments))
    started = time.monotonic()
    nxt = await client.text_document_inline_completion_async(inline_params(uri, LAST_LINE, LAST_COLUMN + len(text)))
    assert nxt is not None and nxt.items, "the prefetched suggestion is shown"
    after = (await stats(client))["suggestions"]
    assert after["instant"] == before["instant"] + 1, "answered from the prefetch, not by waiting for the model"
    assert time.monotonic() - started < 5.0


async def test_the_time_cap_stops_generation_and_shows_what_is_complete(tiny_model_dir, workspace):
    async with lsp_session(["--target", str(tiny_model_dir)], workspace=workspace,
                           env={"DRAFTWISE_TEST_FORWARD_DELAY_MS": "40"},  # each forward >= 40 ms
                           initialization_options={"maxTokens": 64, "scope": "full", "maxTimeMs": 300,
                                                   "idleWork": False}) as (client, _):
        await wait_for_state(client)
        uri = (workspace / "capped.py").as_uri()
        open_document(client, uri, TEXT)
        await client.text_document_inline_completion_async(inline_params(uri, LAST_LINE, LAST_COLUMN))
        last = (await stats(client))["last"]
        assert last["stopped"] == "time_limit"
        assert 0 < last["generated_tokens"] < 64


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def slow_client(tiny_model_dir, workspace):
    """Forwards of at least 200 ms: idle work's suggestion is still being written while the test types."""
    async with lsp_session(["--target", str(tiny_model_dir)], workspace=workspace,
                           env={"DRAFTWISE_TEST_FORWARD_DELAY_MS": "200"},
                           initialization_options={"maxTokens": 8, "scope": "full", "maxTimeMs": 0}) as (client, _):
        await wait_for_state(client)
        yield client


async def work_writing(client, uri: str, chars: int, idle: bool) -> dict:
    """Once the engine computes a suggestion for `uri` (idle work or a request, as `idle` says) that
    has written at least `chars` characters: the server's signal, not a guess at how long it takes."""
    return await stats_until(client, lambda s: (r := s["running"]) is not None and r["document"] == uri
                             and r["idle"] == idle and not r["prompt_only"] and r["chars"] >= chars)


async def idle_work_writing(client, uri: str, chars: int) -> dict:
    return await work_writing(client, uri, chars, idle=True)


async def _idle_text_after_n(client, uri: str) -> str:
    """What idle work writes after the user types "n" at the end of TEXT (greedy, so it writes the same
    again). The document is closed afterwards: the shown suggestion leaves the server's memory."""
    open_document(client, uri, TEXT)
    before = await settled(client)
    client.text_document_did_change(insert_change(uri, 2, LAST_LINE, LAST_COLUMN, "n"))
    await stats_until(client, lambda s: s["idle"]["prefetches"] > before["idle"]["prefetches"])
    result = await client.text_document_inline_completion_async(inline_params(uri, LAST_LINE, LAST_COLUMN + 1))
    assert result is not None and len(result.items[0].insert_text) >= 2
    client.text_document_did_close(types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    return result.items[0].insert_text


async def test_typing_what_idle_work_writes_keeps_it_running_and_the_pause_is_answered_from_it(slow_client, workspace):
    client, uri = slow_client, (workspace / "typed-along.py").as_uri()
    text = await _idle_text_after_n(client, uri)
    open_document(client, uri, TEXT)
    before = await settled(client)
    client.text_document_did_change(insert_change(uri, 2, LAST_LINE, LAST_COLUMN, "n"))
    # As VS Code does between keys: a request after its debounce joins idle work's job, and the next
    # key cancels that request.
    await idle_work_writing(client, uri, chars=0)
    joined = asyncio.ensure_future(client.protocol.send_request_async(
        types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, LAST_LINE, LAST_COLUMN + 1), msg_id="joins"))
    await work_writing(client, uri, chars=1, idle=False)  # joined, its first token written, not its last
    assert not joined.done()
    client.text_document_did_change(insert_change(uri, 3, LAST_LINE, LAST_COLUMN + 1, text[0]))  # what it wrote
    client.cancel_request(types.CancelParams(id="joins"))
    result = await client.text_document_inline_completion_async(inline_params(uri, LAST_LINE, LAST_COLUMN + 2))
    assert result is not None and result.items[0].insert_text == text[1:]
    after = await stats(client)
    assert after["suggestions"]["predicted"] == before["suggestions"]["predicted"] + 1
    # Neither the typing nor the cancelled request stopped it: stopped, a new one would have started
    # at the new cursor (and the request would have joined that one).
    assert after["idle"]["prefetches"] == before["idle"]["prefetches"], "still counted as the request it became"
    assert after["idle"]["joined"] == before["idle"]["joined"] + 1
    assert after["last"]["stopped"] != "cancelled"


async def test_typing_something_else_stops_idle_work_and_starts_it_at_the_new_cursor(slow_client, workspace):
    client, uri = slow_client, (workspace / "typed-otherwise.py").as_uri()
    text = await _idle_text_after_n(client, uri)
    other = "#" if text[0] != "#" else "@"
    open_document(client, uri, TEXT)
    before = await settled(client)
    client.text_document_did_change(insert_change(uri, 2, LAST_LINE, LAST_COLUMN, "n"))
    await idle_work_writing(client, uri, chars=1)  # mid-suggestion
    client.text_document_did_change(insert_change(uri, 3, LAST_LINE, LAST_COLUMN + 1, other))
    # Stopped within a forward, and the new cursor's suggestion runs to its end.
    now = await stats_until(client, lambda s: s["idle"]["prefetches"] == before["idle"]["prefetches"] + 2)
    assert now["idle"]["cancelled"] == before["idle"]["cancelled"] + 1
    await settled(client)  # (cut by maxTokens, the new suggestion goes on with its next link)
    result = await client.text_document_inline_completion_async(inline_params(uri, LAST_LINE, LAST_COLUMN + 2))
    assert result is not None and result.items[0].insert_text
    after = await stats(client)
    assert after["suggestions"]["predicted"] == before["suggestions"]["predicted"] + 1, "the new suggestion"
    assert after["idle"]["joined"] == before["idle"]["joined"]
    assert after["requests"] == before["requests"]


async def test_a_cancelled_request_that_joined_idle_work_stops_it_when_no_edit_follows(slow_client, workspace):
    client, uri = slow_client, (workspace / "cancelled-alone.py").as_uri()
    open_document(client, uri, TEXT)
    before = await settled(client)
    client.text_document_did_change(insert_change(uri, 2, LAST_LINE, LAST_COLUMN, "n"))
    await idle_work_writing(client, uri, chars=0)  # after the quiet period: the request joins its job
    pending = asyncio.ensure_future(client.protocol.send_request_async(
        types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, LAST_LINE, LAST_COLUMN + 1), msg_id="alone"))
    await work_writing(client, uri, chars=1, idle=False)  # generating (8 forwards of >= 200 ms)
    assert not pending.done()
    client.cancel_request(types.CancelParams(id="alone"))  # and no keystroke
    now = await stats_until(client, lambda s: s["requests"] > before["requests"])
    assert now["idle"]["joined"] == before["idle"]["joined"] + 1
    assert now["last"]["stopped"] == "cancelled" and now["last"]["generated_tokens"] < 8
    assert now["last"]["forwards_after_cancel"] <= 1


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def capped_client(tiny_model_dir, workspace):
    """Suggestions of 6 tokens: every link of idle work's prediction is cut with more to say, so the
    prediction goes on a link at a time (scope full: no line ends to wait for)."""
    async with lsp_session(["--target", str(tiny_model_dir)], workspace=workspace,
                           initialization_options={"maxTokens": 6, "scope": "full", "maxTimeMs": 0}) as (client, _):
        await wait_for_state(client)
        yield client


async def test_a_prediction_cut_short_goes_on_with_the_next_link_as_the_user_types_along_it(capped_client, workspace):
    client, uri = capped_client, (workspace / "links.py").as_uri()
    open_document(client, uri, TEXT)
    before = await settled(client)
    client.text_document_did_change(insert_change(uri, 2, LAST_LINE, LAST_COLUMN, "n"))
    # Link 1 at the cursor, then link 2 as if the user had typed link 1; then it waits for the user.
    await stats_until(client, lambda s: s["idle"]["prefetches"] >= before["idle"]["prefetches"] + 2)
    ready = await settled(client)
    assert ready["idle"]["prefetches"] == before["idle"]["prefetches"] + 2
    # The editor's request at the cursor is answered with link 1, the engine is not asked.
    first = await client.text_document_inline_completion_async(inline_params(uri, LAST_LINE, LAST_COLUMN + 1))
    link1 = first.items[0].insert_text
    assert link1 and "\n" not in link1, "the tiny model's first tokens must stay on the line for this test"
    # The user types link 1. The request at its end is answered with link 2, and idle work computes
    # link 3, keeping the prediction a link ahead of the cursor.
    client.text_document_did_change(insert_change(uri, 3, LAST_LINE, LAST_COLUMN + 1, link1))
    second = await client.text_document_inline_completion_async(
        inline_params(uri, LAST_LINE, LAST_COLUMN + 1 + len(link1)))
    assert second is not None and second.items and second.items[0].insert_text
    now = await stats_until(client, lambda s: s["idle"]["prefetches"] > ready["idle"]["prefetches"])
    assert now["suggestions"]["predicted"] == ready["suggestions"]["predicted"] + 2
    assert now["requests"] == ready["requests"], "both answered from the prediction"
    assert (await settled(client))["idle"]["prefetches"] == ready["idle"]["prefetches"] + 1, "link 3, no more"
