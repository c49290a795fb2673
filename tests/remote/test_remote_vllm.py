"""The `openai:` backend against vLLM itself (its CPU build, `make test-vllm`), serving the 0.5B pack
with its own ngram speculation and an API key: the text over LSP is vLLM's own greedy answer cut by
the stop rules; a stop rule, `$/cancelRequest` and a superseding edit make vLLM stop generating, as
its own /metrics show; its speculation is reported in draftwise/stats; it is killed mid-generation
and restarted on the same port; a wrong model name; the API key reaches no log."""
from __future__ import annotations

import asyncio
import sys
import time
import warnings

import pytest
import pytest_asyncio
from lsprotocol import types

from conftest import MODEL_NAME, PRESET, VllmServer, cancel_once_decoding, check_type_ahead, configure, fim_answer, shown_answer
from lsp_harness import inline_params, insert_change, lsp_session, open_document, stats, wait_for_state

pytestmark = [pytest.mark.remote, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

API_KEY = "sk-draftwise-VLLM-SENTINEL-51c0"
MAX_TOKENS = 48
LONG = 400
FIB = "def fib(n):\n    \"\"\"The n-th Fibonacci number.\"\"\"\n"
PRIMES = "PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29,"


@pytest.fixture(scope="module")
def vllm(vllm_python, tmp_path_factory):
    from decoding.models import pack
    from decoding.models.specs import PRESETS

    server = VllmServer(vllm_python, pack.preset_dir(PRESETS[PRESET]), tmp_path_factory.mktemp("vllm"),
                        api_key=API_KEY)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def serve_log(tmp_path_factory):
    return tmp_path_factory.mktemp("serve") / "serve.log"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(vllm, workspace, serve_log):
    import lsp_harness

    serve = lsp_harness.SERVE
    lsp_harness.SERVE = [sys.executable, "-m", "lsp_server.cli", "--debug", "serve"]  # the key must not show even here
    try:
        async with lsp_session(["--target", vllm.target(options="timeout=180"), "--log-file", str(serve_log)],
                               workspace=workspace, env={"DRAFTWISE_API_KEY": API_KEY},
                               initialization_options={"maxTokens": MAX_TOKENS, "maxTimeMs": 0}) as (client, _):
            s = await wait_for_state(client)
            assert s["state"] == "ready", s
            yield client
    finally:
        lsp_harness.SERVE = serve


def vllm_answer(vllm: VllmServer, prefix: str, suffix: str, max_tokens: int) -> str:
    return fim_answer(vllm.url, prefix, suffix, max_tokens, api_key=API_KEY)


async def quiet(vllm: VllmServer, since: float, within_s: float = 1.0) -> dict:
    """Wait until vLLM runs no request and its generated-token count stops growing; return how long
    after `since` that was, and the counts. Fails if it is not quiet within `within_s` (it goes on
    watching for 10 s, to say in the failure how long vLLM went on)."""
    timeline = []
    while True:
        m = vllm.metrics()
        now = time.monotonic() - since
        timeline.append((round(now, 2), m.get("running"), m.get("generated")))
        if m.get("running", 0) == 0:
            await asyncio.sleep(0.3)
            again = vllm.metrics()
            if again.get("generated") == m.get("generated") and again.get("running", 0) == 0:
                assert now < within_s, f"vLLM went on generating for {now:.1f} s: {timeline}"
                return {"after_s": now, **again}
        assert now < max(10.0, within_s), f"vLLM still generating {max(10.0, within_s):.0f} s later: {timeline}"
        await asyncio.sleep(0.05)


def first_try_failed(err: AssertionError, serve_log, label: str = "first try failed") -> None:
    """Print a first try's failure with draftwise's remote log (`request cancelled`, `request ended:
    cancelled` say the cancel reached the stream and closed it) before the one retry."""
    remote = [line for line in serve_log.read_text().splitlines()
              if "draftwise.remote" in line or " ERROR " in line or " WARNING " in line]
    report = f"{label}: {err}\ndraftwise's remote log, last lines:\n" + "\n".join(remote[-12:])
    print(report, file=sys.stderr)
    warnings.warn(report, stacklevel=2)  # shown in the run's summary even when the retry passes


async def settled(vllm: VllmServer) -> float:
    """Wait for vLLM to finish what earlier tests left running (an answer the server still streams
    for a suggestion the user typed along); returns its generated-token count."""
    return (await quiet(vllm, time.monotonic(), within_s=60))["generated"]


async def until_generating(vllm: VllmServer, base: float, tokens: int = 5, timeout_s: float = 120) -> None:
    started = time.monotonic()
    while vllm.metrics().get("generated", 0) < base + tokens:
        assert time.monotonic() - started < timeout_s, "vLLM never started generating"
        await asyncio.sleep(0.05)


async def test_completion_is_vllms_own_greedy_answer_cut_by_the_stop_rules(client, vllm, outside):
    uri = (outside / "fib.py").as_uri()
    text = FIB + "\n\nprint(fib(10))\n"
    open_document(client, uri, text)
    result = await client.text_document_inline_completion_async(inline_params(uri, 2, 0))
    [item] = result.items
    prefix, suffix = FIB, text[len(FIB):]
    raw = vllm_answer(vllm, prefix, suffix, MAX_TOKENS)
    assert item.insert_text == shown_answer(raw, prefix, suffix, text)
    s = await stats(client)
    assert s["last"]["drafter"] == "remote" and s["remote"]["health"] == "ok" and s["remote"]["model"] == MODEL_NAME


async def test_a_stop_rule_closes_the_stream_and_vllm_stops_generating(client, vllm, outside):
    configure(client, maxTokens=LONG, scope="line")
    try:
        uri = (outside / "line.py").as_uri()
        open_document(client, uri, "import os\n\nfor name in os.listdir(\n")
        base = await settled(vllm)
        result = await client.text_document_inline_completion_async(inline_params(uri, 2, 23))
        answered = time.monotonic()
        for item in result.items:
            assert "\n" not in item.insert_text
        q = await quiet(vllm, answered)
        assert q["generated"] - base < LONG // 4, f"vLLM generated {q['generated'] - base} tokens for one line"
    finally:
        configure(client, maxTokens=MAX_TOKENS, scope="auto")


async def test_type_ahead_answers_from_the_suggestion_on_screen(client, outside):
    await check_type_ahead(client, outside, FIB + "\n\nprint(fib(10))\n")


def vllm_decoding(vllm: VllmServer, base: float):
    """When vLLM is decoding the request: 5 tokens counted, or a request running for a second (in one
    CI run its token count did not move until a 21 s answer had ended, so the cancel came too late)."""
    running_since = []

    def decoding() -> bool:
        m = vllm.metrics()
        if m.get("running", 0) >= 1 and not running_since:
            running_since.append(time.monotonic())
        return m.get("generated", 0) >= base + 5 or bool(running_since and time.monotonic() - running_since[0] > 1.0)
    return decoding


ESTABLISHED = "01"
CLOSED_BY_CLIENT = {"04", "05", "06", "0B"}  # FIN_WAIT1, FIN_WAIT2, TIME_WAIT, CLOSING


def established(vllm: VllmServer) -> set:
    return {c for c, state in vllm.client_connections().items() if state == ESTABLISHED}


def watch_the_stream(vllm: VllmServer, base: float):
    """(connections, started): started() says when to cancel: vLLM is decoding (vllm_decoding) and a
    connection carrying the answer is seen; `connections` then holds the ones that may carry it: open
    0.1 s apart (not a short /metrics read), opened since this call where any was (else a pooled one
    carries it, among the open ones). In one CI run vLLM counted a running request while no
    connection to it was open (0 carried the answer): that is not yet the answer streaming to us."""
    before = established(vllm)
    decoding = vllm_decoding(vllm, base)
    connections: set = set()

    def started() -> bool:
        if not decoding():
            return False
        first = established(vllm)
        time.sleep(0.1)
        lasting = first & established(vllm)
        connections.update((lasting - before) or lasting)
        return bool(connections)
    return connections, started


async def closes_a_connection(vllm: VllmServer, streaming: set, since: float, within_s: float = 1.0) -> float:
    """Wait until draftwise closes one of the connections carrying the answer (closed from the client's
    end, or gone: one the server closed stays in CLOSE_WAIT); how long after `since`. What draftwise
    controls: vLLM stops an answer when its connection closes."""
    while True:
        now = vllm.client_connections()
        if any(c not in now or now[c] in CLOSED_BY_CLIENT for c in streaming):
            return time.monotonic() - since
        assert time.monotonic() - since < within_s, \
            f"no connection to vLLM closed within {within_s:.0f} s of the cancel ({len(streaming)} carried the answer)"
        await asyncio.sleep(0.02)


def vllm_went_on_twice(failures: list[str], serve_log) -> None:
    """Both tries: draftwise closed the answer's connection within a second (asserted before this is
    called), and vLLM went on generating all the same. Stopping an answer whose client has gone is
    vLLM's part; in some CI runs (a slower CPU, vLLM's API server behind on its stream) it stops only
    at max_tokens. Reported as an expected failure with both tries' numbers, never as a pass."""
    first_try_failed(AssertionError(failures[-1]), serve_log, label="second try failed too")
    pytest.xfail("vLLM went on generating although draftwise closed the answer's connection within a "
                 f"second, in both tries: {' | '.join(failures)}")


async def test_cancel_request_stops_vllm_within_a_second(client, vllm, outside, serve_log):
    """What draftwise does is checked every time: the answer is RequestCancelled and its connection to
    vLLM closes within a second (test_the_cancel_check_fails_when_draftwise_leaves_the_stream_open
    shows this check fails when draftwise leaves it open). vLLM then stops generating within a second:
    in some CI runs it went on although draftwise had closed the stream. That is retried once, with
    the first try's failure and draftwise's remote log printed (vllm_went_on_twice)."""
    configure(client, maxTokens=LONG, scope="full")
    failures: list[str] = []
    try:
        for attempt in (1, 2):
            uri = (outside / f"primes-{attempt}.py").as_uri()
            open_document(client, uri, PRIMES)
            base = await settled(vllm)
            streaming, started = watch_the_stream(vllm, base)
            cancelled_at = await cancel_once_decoding(client, uri, PRIMES, f"cancel-vllm-{attempt}", started)
            closed_after = await closes_a_connection(vllm, streaming, cancelled_at)
            try:
                q = await quiet(vllm, cancelled_at)
                assert q["generated"] - base < LONG // 2, f"{q['generated'] - base:.0f} of {LONG} tokens generated"
            except AssertionError as err:
                failures.append(f"try {attempt}: {err} (draftwise closed its connection {closed_after:.2f} s "
                                "after the cancel)")
                if attempt == 1:
                    first_try_failed(AssertionError(failures[-1]), serve_log)
                continue
            print(f"connection closed {closed_after * 1000:.0f} ms and vLLM quiet {q['after_s'] * 1000:.0f} ms "
                  f"after the cancel, {q['generated'] - base:.0f} of {LONG} tokens generated")
            return
    finally:
        configure(client, maxTokens=MAX_TOKENS, scope="auto")
    vllm_went_on_twice(failures, serve_log)


async def test_the_cancel_check_fails_when_draftwise_leaves_the_stream_open(vllm, workspace, outside):
    """The test above can fail: with the fault `remote_stream_left_open` (the answer's stream read on
    to its end instead of closed), the same cancel leaves vLLM generating, and `quiet` says so."""
    async with lsp_session(["--target", vllm.target(options="timeout=180")], workspace=workspace,
                           env={"DRAFTWISE_API_KEY": API_KEY, "DRAFTWISE_FAULTS": "remote_stream_left_open"},
                           initialization_options={"maxTokens": LONG, "scope": "full", "maxTimeMs": 0}) as (leaky, _):
        assert (await wait_for_state(leaky))["state"] == "ready"
        uri = (outside / "primes-left-open.py").as_uri()
        open_document(leaky, uri, PRIMES)
        base = await settled(vllm)
        streaming, started = watch_the_stream(vllm, base)
        cancelled_at = await cancel_once_decoding(leaky, uri, PRIMES, "cancel-left-open", started)
        with pytest.raises(AssertionError, match="no connection to vLLM closed"):
            await closes_a_connection(vllm, streaming, cancelled_at)
        with pytest.raises(AssertionError, match="went on generating|still generating"):
            await quiet(vllm, cancelled_at)
    await settled(vllm)  # the server closed with the session: its client's connection, and vLLM's request, end


async def test_a_superseding_edit_closes_the_stale_stream_and_vllm_stops(client, vllm, outside, serve_log):
    """The user types while a long answer streams: the stale request gets nothing, the new one is
    answered, and draftwise closes the stale answer's connection within a second of the edit (checked
    every time, as for `$/cancelRequest` above). vLLM then stops generating; in some CI runs it went on
    (353 and 404 of 400 tokens) although draftwise had closed the stream: retried once, then reported
    as vllm_went_on_twice says."""
    configure(client, maxTokens=LONG, scope="full")
    failures: list[str] = []
    try:
        for attempt in (1, 2):
            uri = (outside / f"supersede-{attempt}.py").as_uri()
            open_document(client, uri, PRIMES)
            base = await settled(vllm)
            streaming, started = watch_the_stream(vllm, base)
            stale = asyncio.ensure_future(
                client.text_document_inline_completion_async(inline_params(uri, 0, len(PRIMES))))
            waited = time.monotonic()
            while not started():
                assert time.monotonic() - waited < 120 and not stale.done(), "vLLM never started generating"
                await asyncio.sleep(0.05)
            client.text_document_did_change(insert_change(uri, 2, 0, len(PRIMES), " 31"))
            edited_at = time.monotonic()
            closed_after = await closes_a_connection(vllm, streaming, edited_at)
            configure(client, maxTokens=4)
            fresh = await client.text_document_inline_completion_async(inline_params(uri, 0, len(PRIMES) + 3))
            answered = time.monotonic()
            old = await asyncio.wait_for(stale, timeout=10)
            assert old is None or not old.items  # superseded: nothing for a stale position
            assert fresh is not None
            try:
                q = await quiet(vllm, answered)
                assert q["generated"] - base < LONG // 2, f"{q['generated'] - base:.0f} tokens: the stale request went on"
            except AssertionError as err:
                failures.append(f"try {attempt}: {err} (draftwise closed its connection {closed_after:.2f} s "
                                "after the edit)")
                if attempt == 1:
                    first_try_failed(AssertionError(failures[-1]), serve_log)
                configure(client, maxTokens=LONG)
                continue
            return
    finally:
        configure(client, maxTokens=MAX_TOKENS, scope="auto")
    vllm_went_on_twice(failures, serve_log)


async def test_stats_report_vllms_own_speculation_over_draftwises_requests(client, vllm, outside):
    await settled(vllm)
    before = vllm.metrics()
    uri = (outside / "spec.py").as_uri()
    text = "values = [1, 2, 3, 4, 5, 6, 7, 8]\ncopy = [1, 2, 3, 4, 5, 6, 7, 8]\nmore = [1, 2, 3,"
    open_document(client, uri, text)
    configure(client, maxTokens=24, scope="full")
    try:
        await client.text_document_inline_completion_async(inline_params(uri, 2, len(text.split("\n")[2])))
    finally:
        configure(client, maxTokens=MAX_TOKENS, scope="auto")
    after = vllm.metrics()
    deadline = time.monotonic() + 5
    while True:
        spec = (await stats(client))["remote"]["speculation"]
        if spec and spec["drafted"] >= after["drafted"] - before["drafted"] or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert after["drafted"] > before["drafted"], "vLLM's ngram speculation drafted nothing on repeated code"
    assert spec is not None and spec["drafted"] > 0 and 0 <= spec["accepted"] <= spec["drafted"]
    assert spec["acceptance"] == round(spec["accepted"] / spec["drafted"], 3)


async def test_a_wrong_model_name_is_reported_and_nothing_else_breaks(vllm, workspace, outside):
    target = vllm.target(model="no-such-model", options=f"tokenizer={PRESET}")
    async with lsp_session(["--target", target], workspace=workspace, env={"DRAFTWISE_API_KEY": API_KEY}) as (client, _):
        s = await wait_for_state(client, ("ready", "failed", "unavailable"))
        assert s["state"] == "unavailable" and s["remote"]["health"] == "wrong_model", s
        assert f"serves {MODEL_NAME}, not 'no-such-model'" in s["error"]
        uri = (outside / "wrong.py").as_uri()
        open_document(client, uri, FIB)
        result = await client.text_document_inline_completion_async(inline_params(uri, 2, 0))
        assert result is not None and not result.items


async def test_vllm_killed_mid_generation_then_restarted_on_the_same_port(client, vllm, outside, serve_log):
    configure(client, maxTokens=LONG, scope="full")
    try:
        uri = (outside / "killed.py").as_uri()
        open_document(client, uri, PRIMES)
        base = await settled(vllm)
        pending = asyncio.ensure_future(client.text_document_inline_completion_async(inline_params(uri, 0, len(PRIMES))))
        await until_generating(vllm, base, tokens=3)
        vllm.stop()
        assert not (await asyncio.wait_for(pending, timeout=20)).items
        s = await stats(client)
        assert s["state"] == "unavailable" and s["remote"]["health"] == "unreachable", s
        vllm.start()
        other = (outside / "after.py").as_uri()
        open_document(client, other, FIB + "\n\nprint(fib(20))\n")
        configure(client, maxTokens=MAX_TOKENS, scope="auto")
        back = await client.text_document_inline_completion_async(inline_params(other, 2, 0))
        assert back.items and back.items[0].insert_text.strip()
        s = await stats(client)
        assert s["state"] == "ready" and s["remote"]["health"] == "ok", s
    finally:
        configure(client, maxTokens=MAX_TOKENS, scope="auto")
    text = serve_log.read_text()
    assert " DEBUG " in text and API_KEY not in text  # the key never reached the log, even at DEBUG
    assert API_KEY not in str(await stats(client))
