"""The repository as context, through a real server process with the tiny model: the workspace index
is built in the background and kept current from the client's notifications; a request shows the
model the definitions it needs from other files, keeps that choice while the user types (so the
prompt's start, and its KV cache, are reused), and never shows a secret-looking file."""
from __future__ import annotations

import pytest
import pytest_asyncio
from lsprotocol import types

from lsp_harness import client_capabilities, inline_params, insert_change, lsp_session, open_document, stats, \
    stats_until, wait_for_state

pytestmark = pytest.mark.asyncio(loop_scope="module")

SHAPES = '''"""Shapes."""


class Rectangle:
    """An axis-aligned rectangle."""

    def __init__(self, width: float, height: float) -> None:
        self.width = width
        self.height = height

    def area(self) -> float:
        return self.width * self.height
'''
APP = "from pkg.shapes import Rectangle\n\n\ndef total(rects: list[Rectangle]) -> float:\n    return "


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    (root / "pkg").mkdir()
    (root / "pkg" / "shapes.py").write_text(SHAPES)
    (root / "pkg" / "__init__.py").write_text("")
    (root / ".env").write_text("SECRET_TOKEN=sk-live-do-not-show\n")
    (root / "notes.log").write_text("def in_a_log(): pass\n")
    (root / ".gitignore").write_text("*.log\n")
    return root


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tiny_model_dir, repo):
    caps = client_capabilities(encodings=["utf-16"], inline=True)
    caps.workspace.did_change_watched_files = types.DidChangeWatchedFilesClientCapabilities(dynamic_registration=True)
    async with lsp_session(["--target", str(tiny_model_dir), "--weights", "int8", "--log-file", str(repo.parent / "repo-serve.log")],
                           workspace=repo, capabilities=caps,
                           initialization_options={"maxTokens": 6, "scope": "full", "maxTimeMs": 0,
                                                   "idleWork": False, "repoContext": True}) as (client, _):
        await wait_for_state(client)
        await stats_until(client, lambda s: s["repoContext"]["index"]["buildS"] is not None)
        yield client


async def test_the_index_holds_the_source_files_and_no_secret_or_ignored_file(client, repo):
    index = (await stats(client))["repoContext"]["index"]
    assert index["building"] is False and index["bytes"] == len(SHAPES)
    assert index["files"] == 2  # pkg/shapes.py, pkg/__init__.py
    assert index["skipped"].get("secret") == 1 and not index["truncated"]


async def test_a_request_shows_the_definition_from_another_file_and_keeps_it_while_typing(client, repo):
    uri = (repo / "pkg" / "app.py").as_uri()
    open_document(client, uri, APP)
    await client.text_document_inline_completion_async(inline_params(uri, 4, 11))
    s = await stats(client)
    last = s["repoContext"]["last"]
    assert last["document"] == "pkg/app.py"
    assert {"path": "pkg/shapes.py", "line": 4, "why": "defines Rectangle"}.items() <= last["sections"][0].items()
    with_context, shown_chars = s["last"]["prompt_tokens"], sum(x["chars"] for x in last["sections"])
    made = s["repoContext"]["selections"]["made"]

    # Typing on the same line: the same selection, so the prompt's start is the stored cache's.
    client.text_document_did_change(insert_change(uri, 2, 4, 11, "sum"))
    await client.text_document_inline_completion_async(inline_params(uri, 4, 14))
    s = await stats(client)
    assert s["repoContext"]["selections"]["made"] == made and s["repoContext"]["selections"]["kept"] >= 1
    assert s["last"]["reused_prompt_tokens"] > with_context - 20, s["last"]
    # promptRead: each request's unread prompt, the first one whole, this one a few tokens
    assert s["promptRead"]["requests"] == s["requests"] >= 2
    assert s["promptRead"]["median"] <= s["promptRead"]["mean"] <= with_context

    # The same request (in a copy of the file) with the repository context off is shorter by the
    # definition it showed.
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"repoContext": False}))
    try:
        client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))
        copy = (repo / "pkg" / "app_copy.py").as_uri()  # the only open document: no other file as context
        open_document(client, copy, APP)
        await client.text_document_inline_completion_async(inline_params(copy, 4, 11))
        s = await stats(client)
        assert s["repoContext"] is None and s["last"]["prompt_tokens"] < with_context - shown_chars // 4
    finally:
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"repoContext": True}))
    # Back on: the index is built again, with the open document's unsaved text.
    s = await stats_until(client, lambda s: s["repoContext"] and s["repoContext"]["index"]["buildS"] is not None)
    assert s["repoContext"]["index"]["files"] == 3  # pkg/shapes.py, pkg/__init__.py, pkg/app_copy.py (open)


async def test_files_changed_outside_the_editor_reach_the_index(client, repo):
    before = (await stats(client))["repoContext"]["index"]["files"]
    circle = repo / "pkg" / "circle.py"
    circle.write_text("import math\n\n\ndef circle_area(radius: float) -> float:\n    return math.pi * radius ** 2\n")
    client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(
        changes=[types.FileEvent(uri=circle.as_uri(), type=types.FileChangeType.Created)]))
    await stats_until(client, lambda s: s["repoContext"]["index"]["files"] == before + 1)
    uri = (repo / "pkg" / "use.py").as_uri()
    open_document(client, uri, "from pkg.circle import circle_area\n\nprint(circle_area(2.0), ")
    await client.text_document_inline_completion_async(inline_params(uri, 2, 24))
    sections = (await stats(client))["repoContext"]["last"]["sections"]
    assert any(s["path"] == "pkg/circle.py" and s["why"] == "defines circle_area" for s in sections), sections

    circle.unlink()
    client.workspace_did_change_watched_files(types.DidChangeWatchedFilesParams(
        changes=[types.FileEvent(uri=circle.as_uri(), type=types.FileChangeType.Deleted)]))
    await stats_until(client, lambda s: s["repoContext"]["index"]["files"] == before + 1)  # use.py came in, circle left
