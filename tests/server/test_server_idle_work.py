"""Idle work through a real server process with the tiny model: the suggestion started while the user
pauses (the editor's request joins it), the prompt read ahead where no suggestion is asked for, the
next suggestion prefetched after one is shown, no generation mid-word, and the time cap."""
from __future__ import annotations

import asyncio
import time

import pytest
import pytest_asyncio
from lsprotocol import types

from lsp_harness import inline_params, inline_session, insert_change, lsp_session, open_document, stats, wait_for_state

pytestmark = pytest.mark.asyncio(loop_scope="module")

TEXT = "import os\n\n\ndef list_files(root):\n    names = []\n    for entry in os.listdir(root):\n        "
LAST_LINE, LAST_COLUMN = 6, 8


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tiny_model_dir, workspace):
    async with inline_session(tiny_model_dir, workspace, maxTokens=10, scope="full") as (client, _):
        await wait_for_state(client)
        yield client


async def until(client, predicate, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        current = await stats(client)
        if predicate(current):
            return current
        assert time.monotonic() < deadline, f"not reached in {timeout:.0f} s: {current}"
        await asyncio.sleep(0.05)


async def settled(client) -> dict:
    """Stats once the earlier tests' idle work is over (no idle count changed for 0.3 s)."""
    current = await stats(client)
    for _ in range(100):
        await asyncio.sleep(0.3)
        previous, current = current, await stats(client)
        if previous["idle"] == current["idle"]:
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


async def test_typing_starts_the_suggestion_and_the_editors_request_joins_it(client, workspace):
    uri = (workspace / "typed.py").as_uri()
    open_document(client, uri, TEXT)
    # Settled: the suggestion the test before showed is prefetched in the background, and that
    # prefetch ending after `before` would pass the wait below before this edit's job even started.
    before = await settled(client)
    client.text_document_did_change(insert_change(uri, 2, LAST_LINE, LAST_COLUMN, "n"))
    # The suggestion at the end of the edit was computed in the quiet period, before the editor asked.
    await until(client, lambda s: s["idle"]["prefetches"] > before["idle"]["prefetches"])
    result = await client.text_document_inline_completion_async(inline_params(uri, LAST_LINE, LAST_COLUMN + 1))
    assert result is not None and result.items
    after = await stats(client)
    assert after["idle"]["joined"] == before["idle"]["joined"] + 1, "the request took the idle job's answer"
    assert after["requests"] == before["requests"] + 1
    assert after["last"]["prompt_tokens"] > 0 and after["last"]["generated_tokens"] > 0


async def test_an_edit_inside_a_word_reads_the_prompt_ahead_and_the_request_reuses_it(client, workspace):
    uri = (workspace / "mid-word-typed.py").as_uri()
    open_document(client, uri, "names = sorted(entries)\n")
    before = await settled(client)
    client.text_document_did_change(insert_change(uri, 2, 0, 3, "e"))  # nam|es: no suggestion there
    await until(client, lambda s: s["idle"]["prepared_tokens"] > before["idle"]["prepared_tokens"])
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
    await until(client, lambda s: s["suggestions"]["prefetched"] > before["prefetched"])
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
