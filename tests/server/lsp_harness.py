"""Helpers for driving real server processes (`draftwise serve` over stdio) with a pytest-lsp client.

Each test module starts the servers it needs once (module scope); the tests of a module share the
module's event loop, which pytest-lsp requires (`pytestmark = pytest.mark.asyncio(loop_scope="module")`).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Sequence

from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVE = [sys.executable, "-m", "lsp_server.cli", "serve"]
READY_TIMEOUT_S = 180.0


def client_capabilities(*, encodings: list[str] | None = None, inline: bool = True,
                        progress: bool = True) -> types.ClientCapabilities:
    return types.ClientCapabilities(
        general=types.GeneralClientCapabilities(position_encodings=encodings) if encodings else None,
        window=types.WindowClientCapabilities(work_done_progress=progress),
        text_document=types.TextDocumentClientCapabilities(
            inline_completion=types.InlineCompletionClientCapabilities() if inline else None,
            completion=types.CompletionClientCapabilities(),
            synchronization=types.TextDocumentSyncClientCapabilities(),
        ),
        workspace=types.WorkspaceClientCapabilities(workspace_folders=True, configuration=True),
    )


@contextlib.asynccontextmanager
async def lsp_session(server_args: list[str], *, workspace: Path, env: dict[str, str] | None = None,
                      capabilities: types.ClientCapabilities | None = None,
                      initialization_options: Any = None) -> AsyncIterator[tuple[LanguageClient, types.InitializeResult]]:
    server_env = {**os.environ, **(env or {})}
    server_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    client = await ClientServerConfig(server_command=[*SERVE, *server_args], server_env=server_env).start()
    try:
        result = await client.initialize_session(types.InitializeParams(
            capabilities=capabilities or client_capabilities(),
            root_uri=workspace.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name=workspace.name)],
            initialization_options=initialization_options,
        ))
        yield client, result
        await client.shutdown_session()
    finally:
        server = client._server  # pytest-lsp keeps the process here; it has no public handle
        if server is not None and server.returncode is None and client.error is None:
            # A failed test skipped shutdown/exit: stop() would wait for an exit that never comes.
            server.kill()
        await client.stop()


def inline_session(model_dir: Path, workspace: Path, *, args: Sequence[str] = (), **options: Any):
    """A session with a client that shows inline completions (UTF-16 positions), started with
    `options` as initializationOptions (and `args` as more `draftwise serve` flags)."""
    return lsp_session(["--target", str(model_dir), *args], workspace=workspace,
                       capabilities=client_capabilities(encodings=["utf-16"], inline=True),
                       initialization_options=options)


def plain(value: Any) -> Any:
    """pygls hands results of custom requests over as namedtuples; tests compare plain JSON values."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


async def custom_request(client: LanguageClient, method: str, params: Any = None) -> Any:
    return plain(await client.protocol.send_request_async(method, params if params is not None else {}))


async def stats(client: LanguageClient) -> dict[str, Any]:
    return await custom_request(client, "draftwise/stats")


async def stats_until(client: LanguageClient, predicate, timeout: float = 20.0) -> dict[str, Any]:
    """The server's stats once `predicate` holds for them (polled every 50 ms)."""
    deadline = time.monotonic() + timeout
    while True:
        current = await stats(client)
        if predicate(current):
            return current
        assert time.monotonic() < deadline, f"not reached in {timeout:.0f} s: {current}"
        await asyncio.sleep(0.05)


async def wait_for_state(client: LanguageClient, states: tuple[str, ...] = ("ready", "failed"),
                         timeout: float = READY_TIMEOUT_S) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        current = await stats(client)
        if current["state"] in states:
            return current
        if time.monotonic() > deadline:
            raise AssertionError(f"server still {current['state']!r} after {timeout:.0f} s: {current}")
        await asyncio.sleep(0.1)


def open_document(client: LanguageClient, uri: str, text: str, language: str = "python", version: int = 1) -> None:
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id=language, version=version, text=text)))


def inline_params(uri: str, line: int, character: int, *,
                  trigger: types.InlineCompletionTriggerKind = types.InlineCompletionTriggerKind.Automatic
                  ) -> types.InlineCompletionParams:
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=line, character=character),
        context=types.InlineCompletionContext(trigger_kind=trigger))


def insert_change(uri: str, version: int, line: int, character: int, text: str) -> types.DidChangeTextDocumentParams:
    at = types.Position(line=line, character=character)
    return types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(range=types.Range(start=at, end=at), text=text)])


def units(text: str, encoding: str) -> int:
    """Length of text in the client's position units, computed with Python's codecs."""
    if encoding == "utf-8":
        return len(text.encode("utf-8"))
    if encoding == "utf-16":
        return len(text.encode("utf-16-le")) // 2
    return len(text)


async def send_raw_request(client: LanguageClient, method: str, params: Any) -> Any:
    """Send params exactly as given, bypassing the client's typed messages (which cannot express a
    malformed request). Uses pygls internals: its send path and its table of pending requests."""
    msg_id = f"raw-{uuid.uuid4().hex[:8]}"
    future: concurrent.futures.Future = concurrent.futures.Future()
    client.protocol._request_futures[msg_id] = future
    client.protocol._send_data({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
    return await asyncio.wrap_future(future)
