"""A real `draftwise serve` as a user starts it: its resident memory per weight format (what a
user's machine gives up), and how long a start takes to its first suggestion.

Each measurement gets its own server process (one model per process, as users run it), which loads,
answers one inline completion, and is measured before it shuts down.
"""
from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

SAMPLE = "import os\n\n\ndef list_python_files(root):\n    \"\"\"Every .py file under root.\"\"\"\n    "


class _StdioClient:
    """Just enough JSON-RPC over stdio to drive one server: the bench is tooling inside decoding/,
    which never imports pygls, so it speaks the protocol's framing itself."""

    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL)
        self._ids = itertools.count(1)

    def notify(self, method: str, params: dict | None = None) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params or {}})

    def request(self, method: str, params: dict | None = None) -> object:
        request_id = next(self._ids)
        self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}})
        while True:  # notifications and the server's own requests come in between
            message = self._read()
            if message.get("id") == request_id and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error'].get('message')}")
                return message.get("result")
            if "method" in message and "id" in message:  # e.g. window/workDoneProgress/create
                self._send({"jsonrpc": "2.0", "id": message["id"], "result": None})

    def _send(self, message: dict) -> None:
        body = json.dumps(message).encode()
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.process.stdin.flush()

    def _read(self) -> dict:
        length = None
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError("the server closed its output")
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.decode("ascii").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        return json.loads(self.process.stdout.read(length))

    def close(self, timeout_s: float = 30) -> None:
        try:
            self.request("shutdown")
            self.notify("exit")
            self.process.wait(timeout_s)
        except Exception:  # noqa: BLE001 - a server that will not stop is stopped
            self.process.kill()
            self.process.wait()


def _started(target: str, weights: str, extra: list[str], timeout_s: float) -> tuple[_StdioClient, float]:
    """A `draftwise serve` process, initialized and loaded; and when it was spawned (time.monotonic())."""
    exe = shutil.which("draftwise") or str(Path(sys.executable).with_name("draftwise"))
    spawned = time.monotonic()
    client = _StdioClient([exe, "serve", "--target", target, "--weights", weights, *extra])
    try:
        client.request("initialize", {"processId": None, "rootUri": None, "capabilities": {}})
        client.notify("initialized")
        deadline = spawned + timeout_s
        while True:
            stats = client.request("draftwise/stats") or {}
            state = stats.get("state")
            if state == "ready":
                return client, spawned
            if state == "failed" or time.monotonic() > deadline:
                raise RuntimeError(f"draftwise serve --weights {weights} {' '.join(extra)} did not load ({state})")
            time.sleep(0.1)
    except BaseException:
        client.close()
        raise


def _first_suggestion(client: _StdioClient) -> None:
    uri = "file:///bench/memory.py"
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                            "text": SAMPLE}})
    lines = SAMPLE.split("\n")
    client.request("textDocument/inlineCompletion", {
        "textDocument": {"uri": uri}, "position": {"line": len(lines) - 1, "character": len(lines[-1])},
        "context": {"triggerKind": 2}})  # Automatic


def _measure(target: str, weights: str, extra: list[str], timeout_s: float) -> float:
    import psutil

    client, _ = _started(target, weights, extra, timeout_s)
    try:
        if "--draft" in extra:  # a draft model that did not load leaves a server without it: not this row
            stats = client.request("draftwise/stats") or {}
            if not stats.get("draftLoaded"):  # (its note may name folders: a kept JSON gets none)
                raise RuntimeError("the draft model did not load (draftwise/stats: draftLoaded false)")
        _first_suggestion(client)
        return psutil.Process(client.process.pid).memory_info().rss / 2**20
    finally:
        client.close()


def serve_rss_mib(target: str, formats: list[str], draft: str | None = None, draft_weights: str = "auto",
                  timeout_s: float = 900) -> dict[str, float | str]:
    """Resident memory (MiB) of a `draftwise serve` per weight format after one completion; with a
    draft model also `FORMAT+draft` (the same server keeping the draft model too). A format that
    cannot be measured gets why, the others are still measured."""
    out: dict[str, float | str] = {}
    runs = [(fmt, fmt, []) for fmt in formats]
    if draft:
        runs += [(f"{fmt}+draft", fmt, ["--draft", draft, "--draft-weights", draft_weights, "--drafter", "model"])
                 for fmt in formats if fmt != "fp32"]
    for label, fmt, extra in runs:
        try:
            out[label] = round(_measure(target, fmt, extra, timeout_s), 1)
        except Exception as exc:  # noqa: BLE001 - one format that fails must not lose the others
            out[label] = f"not measured: {type(exc).__name__}: {exc}".splitlines()[0]
    return out


def serve_start(target: str, weights: str, timeout_s: float = 900) -> dict | str:
    """A fresh `draftwise serve`: seconds from spawning it to ready, and to its first inline suggestion
    (asked the moment it is ready, as an editor does on opening a file); or why it was not measured."""
    try:
        client, spawned = _started(target, weights, [], timeout_s)
        try:
            ready_s = time.monotonic() - spawned
            _first_suggestion(client)
            return {"ready_s": round(ready_s, 2), "first_suggestion_s": round(time.monotonic() - spawned, 2)}
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - a start that fails must not lose the bench
        return f"not measured: {type(exc).__name__}: {exc}".splitlines()[0]
