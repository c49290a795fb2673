"""Resident memory of a real `draftwise serve` per weight format: what a user's machine gives up.

Each format gets its own server process (one model per process, as users run it), which loads,
answers one inline completion, and is measured with psutil before it shuts down.
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


def _measure(target: str, weights: str, extra: list[str], timeout_s: float) -> float:
    import psutil

    exe = shutil.which("draftwise") or str(Path(sys.executable).with_name("draftwise"))
    client = _StdioClient([exe, "serve", "--target", target, "--weights", weights, *extra])
    try:
        client.request("initialize", {"processId": None, "rootUri": None, "capabilities": {}})
        client.notify("initialized")
        deadline = time.monotonic() + timeout_s
        while True:
            stats = client.request("draftwise/stats") or {}
            state = stats.get("state")
            if state == "ready":
                break
            if state == "failed" or time.monotonic() > deadline:
                raise RuntimeError(f"draftwise serve --weights {weights} did not load ({state})")
            time.sleep(0.5)
        uri = "file:///bench/memory.py"
        client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                                "text": SAMPLE}})
        lines = SAMPLE.split("\n")
        client.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": uri}, "position": {"line": len(lines) - 1, "character": len(lines[-1])},
            "context": {"triggerKind": 2}})  # Automatic
        return psutil.Process(client.process.pid).memory_info().rss / 2**20
    finally:
        client.close()


def serve_rss_mib(target: str, formats: list[str], extra: list[str] | None = None,
                  timeout_s: float = 900) -> dict[str, float | str]:
    """format -> RSS in MiB after one completion (or why it could not be measured)."""
    out: dict[str, float | str] = {}
    for fmt in formats:
        try:
            out[fmt] = round(_measure(target, fmt, list(extra or []), timeout_s), 1)
        except Exception as exc:  # noqa: BLE001 - one format failing must not lose the bench
            out[fmt] = f"not measured: {type(exc).__name__}: {exc}".splitlines()[0]
    return out
