"""A real `draftwise serve` as a user starts it: its resident memory per weight format (what a
user's machine gives up), and how long a start takes to its first suggestion per `--compile` setting.

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
        _first_suggestion(client)
        return psutil.Process(client.process.pid).memory_info().rss / 2**20
    finally:
        client.close()


def serve_start(target: str, weights: str, compile_modes: tuple[str, ...] = ("off", "on"),
                timeout_s: float = 900, live_within_s: float = 300) -> dict[str, dict | str]:
    """Per `--compile` setting, a fresh `draftwise serve`: seconds from spawning it to its first inline
    suggestion (asked the moment it is ready, as an editor does on opening a file), the forward that
    answered it, and for a compiled start how long after spawning its graphs were ready (built, or
    loaded from the on-disk caches a start before left: a second start; `live_s`)."""
    out: dict[str, dict | str] = {}
    for mode in compile_modes:
        try:
            client, spawned = _started(target, weights, ["--compile", mode], timeout_s)
            try:
                ready_s = time.monotonic() - spawned
                _first_suggestion(client)
                first_s = time.monotonic() - spawned
                stats = client.request("draftwise/stats") or {}
                row = {"ready_s": round(ready_s, 2), "first_suggestion_s": round(first_s, 2),
                       "answered_on": stats.get("forward"), "compile_state": (stats.get("compile") or {}).get("state")}
                deadline = time.monotonic() + live_within_s
                while mode != "off" and time.monotonic() < deadline:
                    compile_ = (client.request("draftwise/stats") or {}).get("compile") or {}
                    # built: live from the next request on (graphs never switch in the middle of one)
                    if compile_.get("state") in ("live", "built", "off") or str(compile_.get("state", "")).startswith("failed"):
                        row.update(live_s=round(time.monotonic() - spawned, 2), compile_state=compile_.get("state"),
                                   compile_seconds=compile_.get("seconds"))
                        break
                    time.sleep(0.25)
                out[mode] = row
            finally:
                client.close()
        except Exception as exc:  # noqa: BLE001 - one setting failing must not lose the bench
            out[mode] = f"not measured: {type(exc).__name__}: {exc}".splitlines()[0]
    return out
