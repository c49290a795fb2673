"""`draftwise serve`, the real command, with test-only instruments for the reliability tests.

    python tests/reliability/introspect_server.py serve --target DIR ...

Everything the server does is the real code (the CLI, `lsp_server.server.run`, the engine). Added:

- a request `draftwiseTest/introspect` that reports what a leak would show as growth: asyncio tasks,
  threads, pygls' table of in-flight handler futures, the server's own task sets, the engine's jobs
  and queue, and the number of objects the garbage collector tracks;
- a record of every completion request handed to the engine (document, path, context file paths, and
  whether a watched string appears in the context), for the workspace-boundary tests;
- DRAFTWISE_TEST_SLOW_ENGINE_IMPORT_S: importing the engine takes that much longer (a cold start),
  to land client messages inside that window deterministically;
- an audit hook that records every file or directory the process opens, lists or stats under
  $DRAFTWISE_TEST_WATCH_DIR, to prove the server never reads files outside the workspace.

These live here, not in the server, because they exist only to observe it.
"""
from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

INTROSPECT_REQUEST = "draftwiseTest/introspect"
WATCH_DIR = os.environ.get("DRAFTWISE_TEST_WATCH_DIR")
WATCH_TEXT = os.environ.get("DRAFTWISE_TEST_WATCH_TEXT")

touched_watched_paths: list[str] = []
engine_requests: list[dict] = []


def _audit(event: str, args: tuple) -> None:
    if event not in ("open", "os.listdir", "os.scandir", "os.stat") or not args:
        return
    path = args[0]
    if isinstance(path, bytes):
        path = path.decode("utf-8", "replace")
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if isinstance(path, str) and WATCH_DIR and os.path.abspath(path).startswith(WATCH_DIR):
        touched_watched_paths.append(f"{event} {path}")


def _slow_engine_import(seconds: float) -> None:
    """Make importing the engine (torch, transformers) take `seconds` longer, as on a cold disk."""
    import importlib
    import time

    real_import_module = importlib.import_module

    def import_module(name, package=None):
        if name == "decoding.engine":
            time.sleep(seconds)
        return real_import_module(name, package)

    importlib.import_module = import_module


def _instrument() -> None:
    from lsp_server import engine_host, server as server_module

    if os.environ.get("DRAFTWISE_TEST_SLOW_ENGINE_IMPORT_S"):
        _slow_engine_import(float(os.environ["DRAFTWISE_TEST_SLOW_ENGINE_IMPORT_S"]))

    original_submit = engine_host.EngineHost.submit

    def recording_submit(self, request, version, idle=False):
        engine_requests.append({
            "document": request.document, "path": request.path,
            "context": [c.path for c in request.context],
            "watchedTextInContext": bool(WATCH_TEXT) and any(WATCH_TEXT in c.text for c in request.context),
        })
        return original_submit(self, request, version, idle=idle)

    engine_host.EngineHost.submit = recording_submit

    original_create = server_module.create_server

    def create_server(config):
        server = original_create(config)

        @server.feature(INTROSPECT_REQUEST)
        def introspect(ls, params):
            engine = ls.engine_host._engine
            futures = ls.protocol._request_futures
            return {
                "asyncioTasks": len(asyncio.all_tasks()),
                "threads": sorted(t.name for t in threading.enumerate()),
                "requestFutures": len(futures),
                "pendingRequestFutures": sum(not f.done() for f in list(futures.values())),
                "serverTasks": len(ls._tasks),
                "backgroundTasks": len(ls.completions.typing_along._background),
                "engineJobs": len(engine.jobs) if engine is not None else 0,
                "engineQueue": engine._worker._queue.qsize() if engine is not None else 0,
                "gcObjects": len(gc.get_objects()),
                "touchedWatchedPaths": list(touched_watched_paths),
                "engineRequests": list(engine_requests),
            }

        return server

    server_module.create_server = create_server


if __name__ == "__main__":
    if WATCH_DIR:
        sys.addaudithook(_audit)
    _instrument()
    from lsp_server.cli import main

    sys.exit(main(sys.argv[1:]))
