"""The draftwise server as the replay's backend: `draftwise serve` started as a child process and
spoken to over stdio, as an editor does (through `bench.raw_client`)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import psutil

from bench.raw_client import RawServer
from bench.replay.editor import Document, ReplayedSuggestion

SERVE = [sys.executable, "-m", "lsp_server.cli", "serve"]  # this checkout's server, this interpreter
IDLE_SETTING = "idleWork"  # suggestions started at pauses, read-ahead and prefetch after display; a boolean
LOAD_TIMEOUT_S = 600.0


class DraftwiseBackend:
    def __init__(self, serve_args: list[str], idle: bool, workspace: Path, log_path: Path,
                 settings: dict | None = None) -> None:
        self.idle = idle
        self.settings = {**(settings or {}), IDLE_SETTING: idle}  # the server's settings (draftwise.*)
        self.workspace = workspace
        self.server = RawServer(serve_args, log_path=log_path, command=SERVE)
        self.process = psutil.Process(self.server.pid)

    def start(self) -> dict:
        """Initialize with the idle setting (in the options and once more as a configuration
        change, as editors send it) and wait for the model; returns `draftwise/stats`."""
        settings = self.settings
        self.server.initialize(self.workspace, options=settings, encodings=["utf-32"])
        self.server.notify("workspace/didChangeConfiguration", {"settings": {"draftwise": settings}})
        stats = self.server.wait_for_state(timeout=LOAD_TIMEOUT_S)
        if stats["state"] != "ready":
            raise RuntimeError(f"the server could not load its model: {stats.get('error')}")
        return stats

    def idle_setting_known(self) -> bool:
        """Whether the server took `idleWork` (it logs the keys it ignores)."""
        lines = self.server.log_text().splitlines()
        return not any("ignoring unknown draftwise settings" in line and IDLE_SETTING in line for line in lines)

    def cpu_seconds(self) -> float:
        times = self.process.cpu_times()
        return times.user + times.system + times.children_user + times.children_system

    def final_report(self) -> dict:
        """After the typing, before stop(): the server's stats and whether it took the idle setting."""
        return {"stats": self.server.stats(), "idle_setting_known": self.idle_setting_known()}

    def stop(self) -> None:
        try:
            self.server.shutdown_and_exit(timeout=30)
        except (AssertionError, TimeoutError, OSError):
            pass
        self.server.close()

    # ---- the editor's side (editor.Backend) ----------------------------------------------------

    def open(self, doc: Document) -> None:
        self.server.open(doc.uri, doc.text, language=doc.language, version=doc.version)

    def change(self, doc: Document, start: dict, end: dict, text: str) -> None:
        self.server.notify("textDocument/didChange", {
            "textDocument": {"uri": doc.uri, "version": doc.version},
            "contentChanges": [{"range": {"start": start, "end": end}, "text": text}]})

    def request(self, doc: Document) -> Any:
        return self.server.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": doc.uri}, "position": doc.position(doc.cursor),
            "context": {"triggerKind": 2}})  # automatic, as while typing

    def cancel(self, handle: Any) -> None:
        self.server.notify("$/cancelRequest", {"id": handle})

    def answer(self, handle: Any, doc: Document, deadline: float) -> tuple[ReplayedSuggestion | None, float] | None:
        got = self.server.response_by(handle, deadline)
        if got is None:
            return None
        message, arrived = got
        items = (message.get("result") or {}).get("items") or []  # null (stale), an error or no items
        if not items:
            return None, arrived
        item = items[0]
        text = item["insertText"] if isinstance(item["insertText"], str) else item["insertText"]["value"]
        rng = item.get("range") or {"start": doc.position(doc.cursor), "end": doc.position(doc.cursor)}
        return ReplayedSuggestion(text, doc.offset(rng["start"]), doc.offset(rng["end"]), item.get("command")), arrived

    def accepted(self, suggestion: ReplayedSuggestion) -> None:
        if suggestion.command:
            self.server.request("workspace/executeCommand", {"command": suggestion.command["command"],
                                                             "arguments": suggestion.command.get("arguments", [])})

    def close(self, doc: Document) -> None:
        self.server.notify("textDocument/didClose", {"textDocument": {"uri": doc.uri}})
