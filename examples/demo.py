"""The demo: start `draftwise serve`, open a file, ask for an inline completion, print it and its stats.

Then type the first few characters of the suggestion and ask again, as an editor would: the second
answer reuses the KV cache and verifies the rest of the earlier suggestion in one forward.
Usage: python examples/demo.py [--file F --line N --character C] [draftwise serve flags...]
"""
from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

HERE = Path(__file__).resolve().parent


def server_command(extra: list[str]) -> list[str]:
    exe = shutil.which("draftwise") or str(Path(sys.executable).with_name("draftwise"))
    return [exe, "serve", *extra]


def default_position(text: str) -> tuple[int, int]:
    lines = text.split("\n")
    line = max(i for i, l in enumerate(lines) if l.strip() == "" and i > 0 and lines[i - 1].rstrip().endswith(":"))
    return line, len(lines[line])


async def wait_ready(client: LanguageClient, timeout: float = 600) -> dict:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        stats = await client.protocol.send_request_async("draftwise/stats", {})
        stats = stats if isinstance(stats, dict) else stats._asdict() if hasattr(stats, "_asdict") else vars(stats)
        if stats.get("state") in ("ready", "failed"):
            return stats
        await asyncio.sleep(0.5)
    raise TimeoutError("the model did not load in time")


def as_dict(value):
    if hasattr(value, "_asdict"):
        return {k: as_dict(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {k: as_dict(v) for k, v in value.items()}
    return value


def show(title: str, items, stats: dict) -> str:
    text = items[0].insert_text if items else ""
    text = text if isinstance(text, str) else text.value
    s = stats.get("last") or {}
    print(f"\n== {title} ==")
    print(text if text else "(no suggestion)")
    print(f"-- {s.get('generated_tokens')} tokens in {s.get('target_forwards')} target forwards "
          f"({s.get('tokens_per_forward')} per forward); drafted {s.get('drafted_tokens')}, accepted "
          f"{s.get('accepted_tokens')} {s.get('accepted_by')}; prompt {s.get('prompt_tokens')} tokens, "
          f"{s.get('reused_prompt_tokens')} reused; prefill {s.get('prefill_ms')} ms, decode {s.get('decode_ms')} ms; "
          f"stopped: {s.get('stopped')}")
    return text


async def ask(client: LanguageClient, uri: str, pos: types.Position, title: str) -> tuple[str, dict]:
    """One inline completion request, printed with the stats of the engine request that served it."""
    before = as_dict(await client.protocol.send_request_async("draftwise/stats", {})).get("requests", 0)
    start = time.perf_counter()
    # Triggered as an editor does while typing (an explicit invoke waits for alternatives instead).
    result = await client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=pos,
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)))
    answered_ms = (time.perf_counter() - start) * 1000
    items = result.items if isinstance(result, types.InlineCompletionList) else (result or [])
    # A type-ahead answer comes at once; the engine still verifies the rest of the suggestion.
    for _ in range(600):
        stats = as_dict(await client.protocol.send_request_async("draftwise/stats", {}))
        if stats.get("requests", 0) > before:
            break
        await asyncio.sleep(0.1)
    text = show(title, items, stats)
    print(f"-- answered in {answered_ms:.0f} ms")
    return text, stats


async def start_server(client: LanguageClient, folder: Path, serve_flags: list[str]) -> dict:
    """Start `draftwise serve` with `folder` as the workspace; its stats once the model is loaded."""
    cmd = server_command(serve_flags)
    print("starting:", " ".join(cmd), file=sys.stderr)
    await client.start_io(*cmd)
    await client.initialize_async(types.InitializeParams(
        capabilities=types.ClientCapabilities(), root_uri=folder.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=folder.as_uri(), name=folder.name)]))
    client.initialized(types.InitializedParams())
    return await wait_ready(client)


def type_text(client: LanguageClient, uri: str, at: types.Position, text: str) -> None:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(range=types.Range(at, at), text=text)]))


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--file", default=str(HERE / "sample.py"))
    ap.add_argument("--line", type=int)
    ap.add_argument("--character", type=int)
    args, serve_flags = ap.parse_known_args()
    path = Path(args.file).resolve()
    text = path.read_text()
    line, character = (args.line, args.character) if args.line is not None else default_position(text)
    client = LanguageClient("draftwise-demo", "0.1")
    stats = await start_server(client, path.parent, serve_flags)
    if stats.get("state") != "ready":
        print(f"draftwise: the model failed to load: {stats.get('error')}", file=sys.stderr)
        return 1
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
    print(f"{path.name}, line {line}, character {character}:", file=sys.stderr)
    print("\n".join(text.split("\n")[max(0, line - 3):line + 1]), file=sys.stderr)

    suggestion, stats = await ask(client, uri, types.Position(line, character), "suggestion")
    typed = suggestion[:6]
    if typed and "\n" not in typed:
        type_text(client, uri, types.Position(line, character), typed)
        _, stats = await ask(client, uri, types.Position(line, character + len(typed)), f"after typing {typed!r}")
    print(f"\nmodel {stats.get('target')} on {stats.get('device')}, {stats.get('weights')} weights, drafter "
          f"{stats.get('drafter')}\nweights {stats.get('weights')}: {stats.get('weightsReason')}")
    if stats.get("targetChoice"):  # `target: auto`, the default: which model, and why
        print(f"target auto: {stats['target']}: {stats['targetChoice']}")
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return 0 if suggestion.strip() else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
