"""A model that cannot load: the user is told once, the server keeps answering (with nothing), stats
say why, and pointing the settings at a good model brings it back."""
from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio
from lsprotocol import types

from lsp_harness import client_capabilities, inline_params, lsp_session, open_document, stats, wait_for_state

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def broken(workspace, tmp_path_factory):
    missing = tmp_path_factory.mktemp("models") / "no-such-model"
    async with lsp_session(["--target", str(missing)], workspace=workspace,
                           capabilities=client_capabilities(encodings=["utf-16"])) as (client, _):
        client.missing_target = missing
        await wait_for_state(client)
        yield client


async def test_load_failure_is_shown_once_and_explained_in_stats(broken):
    s = await stats(broken)
    assert s["state"] == "failed"
    assert s["error"] and str(broken.missing_target) in s["error"]
    errors = [m for m in broken.messages if m.type == types.MessageType.Error]
    assert len(errors) == 1 and s["error"] in errors[0].message


async def test_requests_get_empty_answers_and_no_more_popups(broken, workspace):
    uri = (workspace / "a.py").as_uri()
    open_document(broken, uri, "def f():\n    return ")
    for _ in range(3):  # keystrokes
        inline = await broken.text_document_inline_completion_async(inline_params(uri, 1, 11))
        assert not inline.items
    popup = await broken.text_document_completion_async(types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=1, character=11)))
    assert not popup.items
    await asyncio.sleep(0.2)
    assert len([m for m in broken.messages if m.type == types.MessageType.Error]) == 1
    assert (await stats(broken))["requests"] == 0


async def test_a_good_target_in_the_settings_recovers(broken, workspace, tiny_model_dir):
    broken.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"draftwise": {"target": str(tiny_model_dir)}}))
    await wait_for_state(broken, ("loading", "ready"))  # leaves "failed" at once
    s = await wait_for_state(broken)
    assert s["state"] == "ready" and s["error"] is None and s["target"] == str(tiny_model_dir)
    uri = (workspace / "a.py").as_uri()
    result = await broken.text_document_inline_completion_async(inline_params(uri, 1, 11))
    assert result is not None and (await stats(broken))["requests"] == 1
