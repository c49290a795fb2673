"""A workspace at the index's file limit: 5,000 files of Python (more are on disk) are indexed on a
background thread while the server goes on answering completions, and the index stops at its limit."""
from __future__ import annotations

import time

import pytest
import pytest_asyncio
from lsprotocol import types

from lsp_harness import inline_params, inline_session, open_document, stats, stats_until, wait_for_state

pytestmark = pytest.mark.asyncio(loop_scope="module")

FILES = 5200  # more than the index takes (decoding/repository/files.py: FileLimits.max_files)


@pytest.fixture(scope="module")
def big_repo(tmp_path_factory):
    """~8 KB a file, ~40 MB in all: under the index's byte limit, so the file limit is what stops it."""
    root = tmp_path_factory.mktemp("big-repo")
    body = "".join(f"def helper_{j}(value: int) -> int:\n    \"\"\"Helper {j}.\"\"\"\n    return value * {j} + {j * 7}\n\n\n"
                   for j in range(90))
    for i in range(FILES):
        package = root / f"pkg{i // 100}"
        package.mkdir(exist_ok=True)
        (package / f"module_{i}.py").write_text(f'"""Module {i}."""\n\n\n' + body.replace("helper_", f"m{i}_helper_"))
    return root


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tiny_model_dir, tmp_path_factory):
    """Started on a small workspace; the big one is added once the model is ready (as a user adds a
    folder), so the test knows the index is building when it asks."""
    small = tmp_path_factory.mktemp("small-repo")
    (small / "app.py").write_text("print('hello')\n")
    async with inline_session(tiny_model_dir, small, args=("--weights", "int8"), maxTokens=6, scope="full",
                              maxTimeMs=0, idleWork=False, repoContext=True) as (client, _):
        await wait_for_state(client)
        await stats_until(client, lambda s: s["repoContext"]["index"]["buildS"] is not None)
        yield client


async def test_completions_are_answered_while_5000_files_are_indexed(client, big_repo):
    client.workspace_did_change_workspace_folders(types.DidChangeWorkspaceFoldersParams(
        event=types.WorkspaceFoldersChangeEvent(
            added=[types.WorkspaceFolder(uri=big_repo.as_uri(), name=big_repo.name)], removed=[])))
    await stats_until(client, lambda s: s["repoContext"]["index"]["building"])
    uri = (big_repo / "pkg0" / "use.py").as_uri()
    open_document(client, uri, "from pkg0.module_1 import m1_helper_3\n\nprint(m1_helper_3(")
    started = time.monotonic()
    result = await client.text_document_inline_completion_async(inline_params(uri, 2, len("print(m1_helper_3(")))
    waited = time.monotonic() - started
    now = await stats(client)
    during = now["repoContext"]["index"]
    assert result is not None and now["last"]["generated_tokens"] > 0, now["last"]  # the engine ran it
    assert during["building"], f"the index was built before the request was answered: {during}"
    done = await stats_until(client, lambda s: not s["repoContext"]["index"]["building"], timeout=300)
    index = done["repoContext"]["index"]
    assert index["files"] == 5000 and index["truncated"], index
    # the index's thread shared the cores with the model, yet the answer took less than the build
    assert waited < index["buildS"], (waited, index)
    print(f"answered in {waited * 1000:.0f} ms while indexing; "
          f"index of {index['files']} files, {index['bytes'] / 2 ** 20:.0f} MiB, built in {index['buildS']} s")
