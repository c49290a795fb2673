"""Resident memory of a real `draftwise serve` per weight format: what a user's machine gives up.

Each format gets its own server process (one model per process, as users run it), which loads,
answers one inline completion, and is measured with psutil before it shuts down.
"""
from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

SAMPLE = "import os\n\n\ndef list_python_files(root):\n    \"\"\"Every .py file under root.\"\"\"\n    "


async def _measure(target: str, weights: str, extra: list[str], timeout_s: float) -> float:
    import psutil
    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    exe = shutil.which("draftwise") or str(Path(sys.executable).with_name("draftwise"))
    client = LanguageClient("draftwise-bench-memory", "0.1")
    await client.start_io(exe, "serve", "--target", target, "--weights", weights, *extra)
    try:
        await client.initialize_async(types.InitializeParams(capabilities=types.ClientCapabilities()))
        client.initialized(types.InitializedParams())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            stats = await client.protocol.send_request_async("draftwise/stats", {})
            state = stats.get("state") if isinstance(stats, dict) else getattr(stats, "state", None)
            if state == "ready":
                break
            if state == "failed" or loop.time() > deadline:
                raise RuntimeError(f"draftwise serve --weights {weights} did not load ({state})")
            await asyncio.sleep(0.5)
        uri = "file:///bench/memory.py"
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="python", version=1, text=SAMPLE)))
        lines = SAMPLE.split("\n")
        await client.text_document_inline_completion_async(types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(len(lines) - 1, len(lines[-1])),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)))
        return psutil.Process(client._server.pid).memory_info().rss / 2**20
    finally:
        try:
            await asyncio.wait_for(client.shutdown_async(None), 30)
            client.exit(None)
        finally:
            await client.stop()


def serve_rss_mib(target: str, formats: list[str], extra: list[str] | None = None,
                  timeout_s: float = 900) -> dict[str, float | str]:
    """format -> RSS in MiB after one completion (or why it could not be measured)."""
    out: dict[str, float | str] = {}
    for fmt in formats:
        try:
            out[fmt] = round(asyncio.run(_measure(target, fmt, list(extra or []), timeout_s)), 1)
        except Exception as exc:  # noqa: BLE001 - one format failing must not lose the bench
            out[fmt] = f"not measured: {type(exc).__name__}: {exc}".splitlines()[0]
    return out
