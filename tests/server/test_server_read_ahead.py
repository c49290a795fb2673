"""A just-opened document is read ahead before the first request, and where an editor says its cursor
rests (`draftwise/cursor`) the suggestion there is started: through a real server process with the tiny
model (lsp_server/idle_work.py)."""
from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from lsp_harness import inline_params, inline_session, open_document, stats, stats_until, wait_for_state

pytestmark = pytest.mark.asyncio(loop_scope="module")

# a file that fits the prompt budget: the prompt at its end starts where every cursor's does
TEXT = "".join(f"def handler_{i}(event, context):\n    return process(event, {i})\n\n" for i in range(30))


def cursor(client, uri: str, line: int, character: int) -> None:
    client.protocol.notify("draftwise/cursor", {"textDocument": {"uri": uri},
                                                "position": {"line": line, "character": character}})


async def quiet(client) -> dict:
    """Stats once no idle work runs and no idle count changed for 0.3 s."""
    current = await stats(client)
    for _ in range(100):
        await asyncio.sleep(0.3)
        previous, current = current, await stats(client)
        if previous["idle"] == current["idle"] and current["running"] is None:
            return current
    raise AssertionError(f"idle work never settled: {current['idle']}")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tiny_model_dir, workspace):
    async with inline_session(tiny_model_dir, workspace, maxTokens=8, scope="full", maxTimeMs=0) as (client, _):
        await wait_for_state(client)
        yield client


async def test_a_just_opened_document_is_read_ahead_and_the_first_request_reuses_it(client, workspace):
    before = await quiet(client)
    uri = (workspace / "opened.py").as_uri()
    open_document(client, uri, TEXT)
    read = await stats_until(client, lambda s: s["idle"]["read_aheads"] > before["idle"]["read_aheads"])
    assert read["readAhead"]["opened"] == before["readAhead"]["opened"] + 1
    assert read["idle"]["prepared_tokens"] > before["idle"]["prepared_tokens"] + 300  # the whole file's prompt
    await quiet(client)
    lines = TEXT.count("\n")
    result = await client.text_document_inline_completion_async(inline_params(uri, lines, 0))  # at the end
    last = (await stats(client))["last"]
    assert result is not None and last["prompt_tokens"] > 300
    assert last["reused_prompt_tokens"] == last["prompt_tokens"] - 1, "all of it but the token fed last"
    # a cursor higher up shares the prompt's start: the file fits the budget, so its prefix is the read one's
    await client.text_document_inline_completion_async(inline_params(uri, 40, 4))
    last = (await stats(client))["last"]
    # read: the line's start, its rest as the suffix (at most 32 tokens) and the fill-in-the-middle tokens
    assert last["reused_prompt_tokens"] > 500 and last["prompt_tokens"] - last["reused_prompt_tokens"] <= 40, last


async def test_where_the_cursor_rests_the_suggestion_is_started_and_the_request_joins_it(client, workspace):
    uri = (workspace / "rested.py").as_uri()
    open_document(client, uri, TEXT)
    before = await quiet(client)
    cursor(client, uri, 31, 11)  # `    return |process(event, 15)`: the line's rest becomes the suffix
    hinted = await stats_until(client, lambda s: s["readAhead"]["cursorHints"] > before["readAhead"]["cursorHints"])
    await quiet(client)
    result = await client.text_document_inline_completion_async(inline_params(uri, 31, 11))
    after = await stats(client)
    assert result is not None
    # the editor's request is idle work's: joined (counted once as a request) or answered from its prediction
    joined = after["idle"]["joined"] - before["idle"]["joined"]
    predicted = after["suggestions"]["predicted"] - before["suggestions"]["predicted"]
    assert joined + predicted == 1, (after["idle"], after["suggestions"])
    assert hinted["readAhead"]["cursorHints"] == before["readAhead"]["cursorHints"] + 1
    # the same place again, nothing changed: nothing is read or started twice
    cursor(client, uri, 31, 11)
    await asyncio.sleep(0.5)
    again = await quiet(client)
    assert again["readAhead"]["cursorHints"] == hinted["readAhead"]["cursorHints"]
    assert again["idle"]["read_aheads"] == after["idle"]["read_aheads"]


async def test_a_cursor_hint_for_a_document_that_is_not_open_is_ignored_and_the_server_goes_on(client, workspace):
    cursor(client, (workspace / "never-opened.py").as_uri(), 0, 0)
    client.protocol.notify("draftwise/cursor", {"position": "nonsense"})
    assert (await stats(client))["state"] == "ready"


async def test_idle_work_off_reads_nothing_ahead(tiny_model_dir, workspace):
    async with inline_session(tiny_model_dir, workspace, idleWork=False) as (client, _):
        await wait_for_state(client)
        uri = (workspace / "off.py").as_uri()
        open_document(client, uri, TEXT)
        cursor(client, uri, 3, 4)
        await asyncio.sleep(1.0)
        s = await stats(client)
        assert s["readAhead"] == {"opened": 0, "cursorHints": 0} and s["idle"]["read_aheads"] == 0


async def test_a_document_opened_while_the_model_loads_is_read_once_it_is_ready(tiny_model_dir, workspace):
    async with inline_session(tiny_model_dir, workspace) as (client, _):
        uri = (workspace / "early.py").as_uri()
        open_document(client, uri, TEXT)  # before the engine is ready (the tiny model loads in seconds)
        await wait_for_state(client)
        s = await stats_until(client, lambda s: s["idle"]["read_aheads"] >= 1)
        assert s["readAhead"]["opened"] == 1 and s["idle"]["prepared_tokens"] > 300
