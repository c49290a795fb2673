"""`draftwise serve` with the real Qwen2.5-Coder 0.5B on a standard-library file."""
from __future__ import annotations

import asyncio
import sysconfig
from pathlib import Path

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from lsp_harness import (
    client_capabilities, inline_params, insert_change, lsp_session, open_document, stats, wait_for_state,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.real_model]

SOURCE = Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py"
CUT_AFTER = "    return w."  # in `def fill(...)`: `w = TextWrapper(...)` / `return w.fill(text)`
REQUEST_CANCELLED = -32800
MAX_TOKENS = 128


@pytest.fixture(scope="module")
def stdlib_copy(tmp_path_factory):
    """textwrap.py in a workspace, cut mid-statement: `return w.|` inside fill()."""
    text = SOURCE.read_text(encoding="utf-8")
    start = text.index("\ndef fill(")  # the module function, not TextWrapper.fill
    cut = text.index(CUT_AFTER, start) + len(CUT_AFTER)
    end_of_line = text.index("\n", cut)
    document = text[:cut] + text[end_of_line:]
    root = tmp_path_factory.mktemp("stdlib")
    path = root / "textwrap.py"
    path.write_text(document, encoding="utf-8")
    line = document[:cut].count("\n")
    return root, path.as_uri(), document, (line, len(CUT_AFTER))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def real(real_model, stdlib_copy):
    root, _, _, _ = stdlib_copy
    async with lsp_session(["--target", real_model], workspace=root,
                           capabilities=client_capabilities(encodings=["utf-16"]),
                           # no time cap: these tests look at where generation ends by itself
                           initialization_options={"contextTokens": 512, "maxTimeMs": 0}) as (client, _):
        yield client


async def test_requests_before_the_model_is_ready_get_an_empty_answer_at_once(real, stdlib_copy):
    _, uri, document, (line, column) = stdlib_copy
    open_document(real, uri, document)
    result = await real.text_document_inline_completion_async(inline_params(uri, line, column))
    assert not result.items
    # Answered while the model was still loading: it did not wait for the load.
    assert (await stats(real))["state"] in ("idle", "loading")


async def test_a_real_completion_on_a_standard_library_file(real, stdlib_copy):
    _, uri, _, (line, column) = stdlib_copy
    ready = await wait_for_state(real)
    assert ready["state"] == "ready", ready["error"]
    assert ready["fimTemplate"] == "qwen2.5-coder"
    result = await real.text_document_inline_completion_async(inline_params(uri, line, column))
    [item] = result.items
    assert item.insert_text.startswith("fill(text"), item.insert_text  # the method this function wraps
    assert "\n" not in item.insert_text.strip()  # the statement, not the rest of the file
    assert item.range.start == types.Position(line=line, character=column)
    last = (await stats(real))["last"]
    assert last["generated_tokens"] >= 1 and last["stopped"] in ("stop_rule", "eos", "max_tokens")


async def test_cancel_mid_generation_stops_within_one_forward(real, stdlib_copy):
    _, uri, _, (line, column) = stdlib_copy
    # One token per forward (no drafting), and room for many: the generation outlasts the wait below.
    real.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"draftwise": {"scope": "full", "maxTokens": MAX_TOKENS, "drafter": "none"}}))
    # Type a character the suggestion does not start with: the engine has to generate (and reuses
    # the cached prompt, so generation starts after a short prefill).
    real.text_document_did_change(insert_change(uri, 2, line, column, "x"))
    before = await stats(real)
    # Cancel after the first token: the previous request's time to first token (a full prefill) is
    # an upper bound for this one's (a short one, the prompt's start is cached); then a few tokens.
    first_token_s = (before["last"] or {}).get("first_token_ms", 5000) / 1000
    pending = asyncio.ensure_future(real.protocol.send_request_async(
        types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, line, column + 1), msg_id="real-cancel"))
    await asyncio.sleep(first_token_s + 1.0)
    assert not pending.done(), "finished before the cancel; the test needs a longer generation"  # mid-generation
    real.cancel_request(types.CancelParams(id="real-cancel"))
    with pytest.raises(JsonRpcException) as err:
        await asyncio.wait_for(pending, timeout=10)
    assert err.value.code == REQUEST_CANCELLED
    for _ in range(200):
        after = await stats(real)
        if after["requests"] > before["requests"]:
            break
        await asyncio.sleep(0.05)
    last = after["last"]
    assert last["stopped"] == "cancelled"
    assert last["forwards_after_cancel"] <= 1
    assert 1 <= last["generated_tokens"] < MAX_TOKENS
