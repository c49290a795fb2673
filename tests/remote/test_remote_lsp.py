"""Inline completions through the real `draftwise serve` (over LSP, pytest-lsp) with the remote
backend in front of a real inference engine (llama-cpp-python's server, see conftest.py): the text,
stop rules, type-ahead, stats, cancellation, the client-side deadline and a wrong model name."""
from __future__ import annotations

import asyncio
import time

import pytest
import pytest_asyncio
from lsprotocol import types

from conftest import MODEL_NAME, PRESET, cancel_once_decoding, check_type_ahead, configure, fim_answer, shown_answer, remote_session
from lsp_harness import inline_params, lsp_session, open_document, stats, wait_for_state

pytestmark = [pytest.mark.remote, pytest.mark.asyncio(loop_scope="module")]

MAX_TOKENS = 48
LONG = 400  # max tokens of the runs that are cancelled or cut by the deadline
FIB = "def fib(n):\n    \"\"\"The n-th Fibonacci number.\"\"\"\n"
PRIMES = "PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29,"  # the model lists primes for hundreds of tokens


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(engine, workspace):
    # A generous deadline: on a loaded 2-core machine the engine's first token can take many seconds.
    async with remote_session(engine.target(options="timeout=180"), workspace, MAX_TOKENS) as client:
        yield client


async def settled(client, requests: int, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        s = await stats(client)
        if s["requests"] >= requests or time.monotonic() > deadline:
            return s
        await asyncio.sleep(0.05)


def engine_answer(engine, prefix: str, suffix: str, max_tokens: int) -> str:
    return fim_answer(engine.url, prefix, suffix, max_tokens, repeat_penalty=1.0)


async def test_completion_is_the_engines_text_cut_by_the_stop_rules(client, engine, outside):
    uri = (outside / "fib.py").as_uri()
    text = FIB + "\n\nprint(fib(10))\n"
    open_document(client, uri, text)
    before = await stats(client)
    result = await client.text_document_inline_completion_async(inline_params(uri, 2, 0))
    [item] = result.items
    assert item.insert_text.strip()

    # The same text, derived without draftwise's remote engine: the engine's whole answer to the same
    # prompt, cut where the stop rules say, shaped for the editor.
    prefix, suffix = FIB, text[len(FIB):]
    raw = engine_answer(engine, prefix, suffix, MAX_TOKENS)
    assert item.insert_text == shown_answer(raw, prefix, suffix, text)

    s = await stats(client)
    last = s["last"]
    assert s["requests"] == before["requests"] + 1
    assert last["drafter"] == "remote" and last["stopped"] in ("stop_rule", "eos", "max_tokens")
    assert 0 < last["first_token_ms"] <= last["prefill_ms"] + last["decode_ms"]
    assert 0 < last["generated_tokens"] <= MAX_TOKENS and last["prompt_tokens"] > 10
    assert s["timing"]["tokens"] == last["generated_tokens"]
    assert s["remote"]["health"] == "ok" and s["remote"]["model"] == MODEL_NAME
    assert s["state"] == "ready" and s["target"].startswith("openai:") and s["fimTemplate"] == "qwen2.5-coder"


async def test_a_stop_rule_closes_the_stream_and_the_engine_stops(client, engine, outside):
    """Mid-line the completion is the rest of the line: the stream closes at the newline, long before
    max tokens, and the engine generates no more than a token after that."""
    configure(client, maxTokens=LONG, scope="line")
    try:
        uri = (outside / "line.py").as_uri()
        open_document(client, uri, "import os\n\nfor name in os.listdir(\n")
        before = await stats(client)
        started = time.monotonic()
        result = await client.text_document_inline_completion_async(inline_params(uri, 2, 23))
        answered = time.monotonic()
        s = await settled(client, before["requests"] + 1)
        await asyncio.sleep(1.5)  # time for any generation that went on after the stream closed
        last = s["last"]
        assert last["stopped"] == "stop_rule", last
        for item in result.items:
            assert "\n" not in item.insert_text
        decoded = engine.decoded(started)
        assert len(decoded) < LONG // 4, f"the engine went on generating: {len(decoded)} tokens"
        assert len([e for e in decoded if e["start"] > answered]) <= 1, "the engine went on after the stop"
        assert all(e["start"] < answered + 1.0 for e in decoded), "the engine generated >1 s after the stop"
    finally:
        configure(client, maxTokens=MAX_TOKENS, scope="auto")


async def test_type_ahead_answers_from_the_suggestion_on_screen(client, outside):
    before = await stats(client)
    await check_type_ahead(client, outside, FIB + "\n\nprint(fib(10))\n")
    after = await stats(client)
    assert after["suggestions"]["instant"] == before["suggestions"]["instant"] + 1


async def test_cancel_request_stops_the_engine_within_a_second(client, engine, outside):
    configure(client, maxTokens=LONG, scope="full")
    try:
        uri = (outside / "primes.py").as_uri()
        open_document(client, uri, PRIMES)
        before = await stats(client)
        started = time.monotonic()
        cancelled_at = await cancel_once_decoding(  # once the engine is decoding
            client, uri, PRIMES, "cancel-remote", lambda: len(engine.decoded(started)) >= 5)
        last = (await settled(client, before["requests"] + 1))["last"]
        assert last["stopped"] == "cancelled"
        await asyncio.sleep(2.5)  # anything the engine still generates shows up in its log by now

        decoded = engine.decoded(started)
        after = [e for e in decoded if e["start"] > cancelled_at]
        last_end = decoded[-1]["t"] - cancelled_at
        print(f"engine decoded {len(decoded)} of {LONG} tokens, {len(after)} begun after the cancel; its last "
              f"forward began {(decoded[-1]['start'] - cancelled_at) * 1000:.0f} ms and ended "
              f"{last_end * 1000:.0f} ms after the cancel")
        assert len(decoded) < LONG // 2
        # A forward in progress cannot be interrupted; the engine must begin no more than one after the
        # cancel (the one it began before it read the closed connection), and none a second later.
        assert len(after) <= 1, after
        assert all(e["start"] - cancelled_at < 1.0 for e in after), after
    finally:
        configure(client, maxTokens=MAX_TOKENS, scope="auto")


async def test_an_answer_the_engine_cuts_off_for_another_request_is_no_outage(client, engine, outside):
    """llama-cpp-python's server ends a stream cleanly, without a finish reason, when another request
    arrives. Here draftwise asks for two documents at once: the cut-off answer ends empty, as an error
    of that request only (no message to the user, the engine's health stays ok), and the other one is
    answered."""
    configure(client, maxTokens=LONG, scope="full")
    try:
        primes, fib = (outside / "primes-cut.py").as_uri(), (outside / "fib-cut.py").as_uri()
        open_document(client, primes, PRIMES)
        open_document(client, fib, FIB + "\n\nprint(fib(10))\n")
        errors = len([m for m in client.messages if m.type == types.MessageType.Error])
        before = await stats(client)
        started = time.monotonic()
        cut = asyncio.ensure_future(client.text_document_inline_completion_async(
            inline_params(primes, 0, len(PRIMES))))
        while len(engine.decoded(started)) < 5:
            assert time.monotonic() - started < 60 and not cut.done(), "the engine never started decoding"
            await asyncio.sleep(0.05)
        asked = time.monotonic()
        other = await asyncio.wait_for(client.text_document_inline_completion_async(inline_params(fib, 2, 0)), 120)
        cut_off = await asyncio.wait_for(cut, timeout=10)

        assert other.items and other.items[0].insert_text.strip()
        assert cut_off is None or not cut_off.items
        s = await settled(client, before["requests"] + 2)
        assert s["requests"] == before["requests"] + 2 and s["last"]["stopped"] != "error", s["last"]
        assert s["remote"]["health"] == "ok" and s["state"] == "ready", s["remote"]
        # The engine's log: the other prompt's prefill came within a token or two of asking (a server
        # that serves one answer after the other would decode hundreds first).
        since_asked = engine.evals(asked)
        prefill = next(i for i, e in enumerate(since_asked) if e["tokens"] > 1)
        assert prefill <= 2, f"the first answer went on for {prefill} tokens: nothing was cut off"
        assert len([m for m in client.messages if m.type == types.MessageType.Error]) == errors, client.messages
    finally:
        configure(client, maxTokens=MAX_TOKENS, scope="auto")


async def test_the_client_side_deadline_stops_a_long_generation(engine, workspace, outside):
    async with lsp_session(["--target", engine.target(options="timeout=2")], workspace=workspace,
                           initialization_options={"maxTokens": LONG, "scope": "full", "maxTimeMs": 0}) as (client, _):
        await wait_for_state(client)
        uri = (outside / "deadline.py").as_uri()
        open_document(client, uri, PRIMES)
        started = time.monotonic()
        result = await asyncio.wait_for(
            client.text_document_inline_completion_async(inline_params(uri, 0, len(PRIMES))), timeout=30)
        answered = time.monotonic()
        s = await stats(client)
        assert s["last"]["stopped"] == "time_limit", s["last"]
        assert result.items and result.items[0].insert_text.strip()  # what came before the deadline
        assert answered - started < 2 + 1.0
        await asyncio.sleep(2.0)
        decoded = engine.decoded(started)
        assert len(decoded) < LONG // 2
        assert len([e for e in decoded if e["start"] > answered]) <= 1
        assert decoded[-1]["start"] < answered + 1.0


async def test_the_time_cap_ends_a_remote_answer_at_a_line_end_and_never_empty(engine, workspace, outside):
    """maxTimeMs is soft, as in the local engine: past it the answer ends at its next line end (a
    first token that comes after the cap is waited for, not taken as a slow server)."""
    async with lsp_session(["--target", engine.target(options="timeout=60")], workspace=workspace,
                           initialization_options={"maxTokens": LONG, "scope": "block", "maxTimeMs": 1}) as (client, _):
        await wait_for_state(client)
        uri = (outside / "capped.py").as_uri()
        open_document(client, uri, PRIMES)
        result = await asyncio.wait_for(
            client.text_document_inline_completion_async(inline_params(uri, 0, len(PRIMES))), timeout=60)
        s = await stats(client)
        assert s["last"]["stopped"] == "time_limit", s["last"]
        assert s["state"] == "ready" and not (s["remote"] or {}).get("problem"), s
        text = result.items[0].insert_text
        assert text.strip() and not text.endswith("\n") and s["last"]["generated_tokens"] < LONG


async def test_a_wrong_model_name_is_reported_and_nothing_else_breaks(engine, workspace, outside):
    target = engine.target(model="no-such-model", options=f"tokenizer={PRESET}")
    async with lsp_session(["--target", target], workspace=workspace) as (client, _):
        s = await wait_for_state(client, ("ready", "failed", "unavailable"))
        assert s["state"] == "unavailable", s
        assert f"serves {MODEL_NAME}, not 'no-such-model'" in s["error"]
        assert s["remote"]["health"] == "wrong_model"
        for _ in range(100):
            if client.messages:
                break
            await asyncio.sleep(0.05)
        assert any("no-such-model" in m.message and m.type == types.MessageType.Error for m in client.messages)
        uri = (outside / "wrong.py").as_uri()
        open_document(client, uri, FIB)
        result = await client.text_document_inline_completion_async(inline_params(uri, 2, 0))
        assert result is not None and not result.items
        assert (await stats(client))["last"]["stopped"] == "error"
        assert len([m for m in client.messages if "no-such-model" in m.message]) == 1  # once, not per request
