"""Idle work with the real Qwen2.5-Coder 0.5B: where the model ends a suggestion at the end of its
line, the prediction goes on with the line after an Enter there, so the request after the user's
Enter is answered at once, and an automatic request at that line end does not ask the engine; at a
pause on an empty line, the suggestion after one more Enter is ready. (The tiny model's text has no
line ends to rely on.)"""
from __future__ import annotations

import pytest
import pytest_asyncio
from lsprotocol import types

from lsp_harness import (
    inline_params, insert_change, lsp_session, open_document, stats, stats_until, wait_for_state,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.real_model]

# The user is typing `continue`, the last line of an `if` body: the model ends the suggestion there
# (the next line belongs to the loop, less indented), and the loop body goes on after an Enter.
TEXT = ("def non_blank(lines):\n"
        "    result = []\n"
        "    for line in lines:\n"
        "        line = line.strip()\n"
        "        if not line:\n"
        "            conti")
LINE, COLUMN = 5, len("            conti")
WAIT_S = 60.0  # for idle work (the real model on 2 cores)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def real(real_model, workspace):
    # int8: the text this test relies on (`ue` to end the line) is int8's; int4, which `auto` picks
    # on a CPU with AVX-512 VNNI, suggests nothing at that cursor (measured), and idle work is what
    # is under test here, not the format
    async with lsp_session(["--target", real_model, "--weights", "int8"], workspace=workspace,
                           initialization_options={"contextTokens": 512}) as (client, _):
        ready = await wait_for_state(client)
        assert ready["state"] == "ready", ready["error"]
        yield client


async def type_and_wait(client, uri: str, typed: str, links: int) -> dict:
    """Open TEXT, type `typed` at its cursor (version 2), and wait for idle work's first `links` links;
    the stats then."""
    open_document(client, uri, TEXT)
    before = await stats(client)
    client.text_document_did_change(insert_change(uri, 2, LINE, COLUMN, typed))
    return await stats_until(client, lambda s: s["idle"]["prefetches"] >= before["idle"]["prefetches"] + links,
                             WAIT_S)


async def test_after_a_line_the_model_ended_the_line_after_the_enter_is_ready(real, workspace):
    client, uri = real, (workspace / "non_blank.py").as_uri()
    # Link 1 at the cursor (`ue`, ended by the model), then the line after an Enter at its end.
    ready = await type_and_wait(client, uri, "n", links=2)
    first = await client.text_document_inline_completion_async(inline_params(uri, LINE, COLUMN + 1))
    assert first is not None and first.items[0].insert_text == "ue", first

    # Typed to the end of the line: the model said nothing more there, so the engine is not asked
    # (asking would cancel the next line).
    client.text_document_did_change(insert_change(uri, 3, LINE, COLUMN + 1, "ue"))
    at_end = await client.text_document_inline_completion_async(inline_params(uri, LINE, COLUMN + 3))
    assert at_end is None or not at_end.items

    # Enter: the next line is answered from idle work at once, then again after its indentation.
    client.text_document_did_change(insert_change(uri, 4, LINE, COLUMN + 3, "\n"))
    after_enter = await client.text_document_inline_completion_async(inline_params(uri, LINE + 1, 0))
    assert after_enter is not None and after_enter.items, after_enter
    next_line = after_enter.items[0].insert_text
    indent = next_line[: len(next_line) - len(next_line.lstrip(" "))]
    assert indent and next_line.strip(), next_line
    client.text_document_did_change(insert_change(uri, 5, LINE + 1, 0, indent))
    indented = await client.text_document_inline_completion_async(inline_params(uri, LINE + 1, len(indent)))
    assert indented is not None and indented.items[0].insert_text == next_line[len(indent):]

    now = await stats(client)
    assert now["requests"] == ready["requests"], "all answered from idle work's prediction"
    assert now["suggestions"]["predicted"] == ready["suggestions"]["predicted"] + 3


async def test_at_a_pause_on_a_blank_line_the_line_after_another_enter_is_ready(real, workspace):
    client, uri = real, (workspace / "blank_line.py").as_uri()
    await type_and_wait(client, uri, "nue", links=1)
    # Enter, and a pause on the empty line: the line after is shown from idle work's prediction, and
    # idle work computes the suggestion after one more Enter (code often leaves a blank line).
    client.text_document_did_change(insert_change(uri, 3, LINE, COLUMN + 3, "\n"))
    on_blank = await client.text_document_inline_completion_async(inline_params(uri, LINE + 1, 0))
    assert on_blank is not None and on_blank.items, on_blank
    shown = await stats(client)
    prefetched = shown["suggestions"]["prefetched"]

    def ended(s: dict) -> int:  # idle jobs that ran to their end
        return s["idle"]["prefetches"] - s["idle"]["cancelled"]

    ready = await stats_until(client, lambda s: s["suggestions"]["prefetched"] == prefetched + 1
                              or (ended(s) > ended(shown) and s["running"] is None), WAIT_S)
    # The user leaves the line blank: the next request is answered at once from that suggestion.
    client.text_document_did_change(insert_change(uri, 4, LINE + 1, 0, "\n"))
    after_blank = await client.text_document_inline_completion_async(inline_params(uri, LINE + 2, 0))
    now = await stats(client)
    if ready["suggestions"]["prefetched"] == prefetched:
        # The model's answer after one more Enter was another blank line and the end (nothing to
        # show). Both answers were seen in runs of this test once int8 got faster (3 of 6 before this
        # branch); not pinned down, most likely which prompt chunks the cache kept between keystrokes
        # (prompt reads use batched attention). Then the engine is asked, as without idle work.
        assert now["requests"] == ready["requests"] + 1
        return
    assert after_blank is not None and after_blank.items and after_blank.items[0].insert_text.strip()
    assert now["suggestions"]["instant"] == ready["suggestions"]["instant"] + 1


async def test_asked_for_by_hand_at_the_end_of_a_line_the_model_ended_the_engine_answers(real, workspace):
    client, uri = real, (workspace / "invoked.py").as_uri()
    # One item per invoked request: those requests may be answered from idle work's prediction too.
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"draftwise": {"contextTokens": 512, "alternatives": 1}}))
    ready = await type_and_wait(client, uri, "nue", links=2)
    automatic = await client.text_document_inline_completion_async(inline_params(uri, LINE, COLUMN + 3))
    assert automatic is None or not automatic.items
    assert (await stats(client))["requests"] == ready["requests"]
    await client.text_document_inline_completion_async(
        inline_params(uri, LINE, COLUMN + 3, trigger=types.InlineCompletionTriggerKind.Invoked))
    assert (await stats(client))["requests"] == ready["requests"] + 1
