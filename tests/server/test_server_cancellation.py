"""Cancellation reaches the verify loop: `$/cancelRequest`, a newer request for the document, and an
edit after the request each stop the running generation within one target forward.

The tiny model is too fast to cancel mid-generation, so this server runs with the engine's test-only
switch DRAFTWISE_TEST_FORWARD_DELAY_MS, which sleeps in every target forward. What the tests assert is
counted by the engine (forwards after the cancel, tokens generated), not timed.
"""
from __future__ import annotations

import asyncio
import time

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from lsp_harness import (
    client_capabilities, inline_params, insert_change, lsp_session, open_document, stats, wait_for_state,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

FORWARD_DELAY_MS = 100
LONG = 200  # max tokens: the generation ends at EOS first (see full_run)
GENERATING_S = 1.5  # long enough for prefill plus several decode forwards
REQUEST_CANCELLED = -32800


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def slow(tiny_model_dir, workspace):
    async with lsp_session(
            ["--target", str(tiny_model_dir)], workspace=workspace,
            env={"DRAFTWISE_TEST_FORWARD_DELAY_MS": str(FORWARD_DELAY_MS)},
            capabilities=client_capabilities(encodings=["utf-16"]),
            # Scope "full" and no drafting: one token per forward, no stop at a line end, no time cap.
            initialization_options={"maxTokens": LONG, "scope": "full", "drafter": "none",
                                    "maxTimeMs": 0}) as (client, _):
        await wait_for_state(client)
        yield client


def configure(client, **settings) -> None:
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"draftwise": settings}))


async def settled_stats(client, requests: int) -> dict:
    """Stats once the engine has recorded `requests` requests (a cancelled job finishes its forward)."""
    deadline = time.monotonic() + 30
    while True:
        s = await stats(client)
        if s["requests"] >= requests or time.monotonic() > deadline:
            return s
        await asyncio.sleep(0.05)


STACK = "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
CURSOR = (4, 0)


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """Documents outside the workspace: no other file joins their prompt as context, so every test's
    prompt is the same and so is the tiny model's (deterministic) output."""
    return tmp_path_factory.mktemp("outside")


def open_stack(client, outside, name: str) -> str:
    uri = (outside / name / "stack.py").as_uri()
    open_document(client, uri, STACK)
    return uri


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def full_run(slow, outside) -> dict:
    """The same request run to its end: how many tokens an uncancelled generation makes."""
    configure(slow, maxTokens=LONG)
    uri = open_stack(slow, outside, "full")
    before = await stats(slow)
    result = await slow.text_document_inline_completion_async(inline_params(uri, *CURSOR))
    assert result is not None
    last = (await settled_stats(slow, before["requests"] + 1))["last"]
    assert last["stopped"] != "cancelled"
    assert last["generated_tokens"] * FORWARD_DELAY_MS / 1000 > 2 * GENERATING_S, \
        "the uncancelled generation is too short to cancel mid-way; pick another prompt"
    return last


async def test_cancel_request_stops_the_engine_within_one_forward(slow, outside, full_run):
    configure(slow, maxTokens=LONG)
    uri = open_stack(slow, outside, "cancel")
    before = await stats(slow)
    msg_id = "cancel-me"
    pending = asyncio.ensure_future(slow.protocol.send_request_async(
        types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, *CURSOR), msg_id=msg_id))
    await asyncio.sleep(GENERATING_S)
    assert not pending.done(), "the request finished before it could be cancelled"
    slow.cancel_request(types.CancelParams(id=msg_id))
    with pytest.raises(JsonRpcException) as err:
        await asyncio.wait_for(pending, timeout=10)
    assert err.value.code == REQUEST_CANCELLED

    after = await settled_stats(slow, before["requests"] + 1)
    last = after["last"]
    assert last["stopped"] == "cancelled"
    assert last["forwards_after_cancel"] <= 1
    assert 1 <= last["generated_tokens"] < full_run["generated_tokens"]  # stopped mid-generation
    assert after["cumulative"]["forwards_after_cancel"] - before["cumulative"]["forwards_after_cancel"] <= 1


async def test_a_newer_request_for_the_document_wins(slow, outside, full_run):
    configure(slow, maxTokens=LONG)
    uri = open_stack(slow, outside, "latest")
    before = await stats(slow)
    first = asyncio.ensure_future(slow.text_document_inline_completion_async(inline_params(uri, *CURSOR)))
    await asyncio.sleep(GENERATING_S)
    assert not first.done()
    configure(slow, maxTokens=3)  # the newer request is short; no reload for this setting
    second = asyncio.ensure_future(slow.text_document_inline_completion_async(inline_params(uri, 3, 0)))

    assert await asyncio.wait_for(first, timeout=10) is None  # superseded: null, as nothing to show
    await asyncio.wait_for(second, timeout=30)
    after = await settled_stats(slow, before["requests"] + 2)
    delta = {k: after["cumulative"][k] - before["cumulative"][k]
             for k in ("target_forwards", "generated_tokens", "forwards_after_cancel")}
    assert delta["forwards_after_cancel"] <= 1
    # The first request stopped mid-generation: both together made fewer tokens than it alone would.
    assert delta["generated_tokens"] < full_run["generated_tokens"]
    assert after["last"]["stopped"] != "cancelled"


async def test_an_edit_after_the_request_cancels_it(slow, outside, full_run):
    configure(slow, maxTokens=LONG)
    uri = open_stack(slow, outside, "edited")
    before = await stats(slow)
    pending = asyncio.ensure_future(slow.text_document_inline_completion_async(inline_params(uri, *CURSOR)))
    await asyncio.sleep(GENERATING_S)
    assert not pending.done()
    slow.text_document_did_change(insert_change(uri, 2, 4, 0, "    "))
    assert await asyncio.wait_for(pending, timeout=10) is None
    last = (await settled_stats(slow, before["requests"] + 1))["last"]
    assert last["stopped"] == "cancelled" and last["forwards_after_cancel"] <= 1
    assert last["generated_tokens"] < full_run["generated_tokens"]
