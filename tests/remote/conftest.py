"""A real inference engine for the remote-backend tests: llama-cpp-python's OpenAI-compatible server
on the offline Qwen2.5-Coder-0.5B GGUF, started on a free loopback port (see engine_server.py).

Every test here is marked `remote` (run by `make test-remote`, left out of `make test`) and skips when
the server's packages or the GGUF are missing.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))  # lsp_harness

from decoding.models import pack  # noqa: E402
from decoding.models.specs import PRESETS  # noqa: E402

PRESET = "qwen2.5-coder-0.5b"
MODEL_NAME = PRESET  # the name the engine serves the model as (--model_alias)
SERVER_PACKAGES = ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings")
CLIENT_PACKAGES = ("openai", "httpx")
START_TIMEOUT_S = 120.0
REQUEST_CANCELLED = -32800


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.remote)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One llama_cpp.server process; stop() kills it like a crash would, start() brings it back on the
    same port. evals() reads the engine's own log of forward passes (engine_server.py)."""

    def __init__(self, gguf: Path, workdir: Path, api_key: str | None = None) -> None:
        self.gguf, self.workdir, self.api_key = gguf, workdir, api_key
        self.port = free_port()
        self.eval_log = workdir / "evals.jsonl"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def target(self, model: str = MODEL_NAME, options: str = "") -> str:
        return f"openai:{self.url}#{model}" + (f"?{options}" if options else "")

    def start(self) -> None:
        cmd = [sys.executable, str(Path(__file__).with_name("engine_server.py")), "--model", str(self.gguf),
               "--model_alias", MODEL_NAME, "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", "4096",
               "--n_threads", "2", "--n_threads_batch", "2", "--verbose", "false"]
        if self.api_key:
            cmd += ["--api_key", self.api_key]
        log = open(self.workdir / "engine.log", "ab")
        env = {**os.environ, "DRAFTWISE_EVAL_LOG": str(self.eval_log)}
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the engine exited ({self.proc.returncode}); see {self.workdir / 'engine.log'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"the engine did not listen within {START_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def evals(self, since: float = 0.0) -> list[dict]:
        """The engine's forward passes that started after `since` (time.monotonic(): one clock for all
        processes on the machine)."""
        if not self.eval_log.exists():
            return []
        out = []
        for line in self.eval_log.read_text().splitlines():
            if line.strip():
                e = json.loads(line)
                if e["start"] >= since:
                    out.append(e)
        return out


@pytest.fixture(scope="session")
def remote_gguf() -> Path:
    missing = [m for m in SERVER_PACKAGES + CLIENT_PACKAGES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the remote tests need {', '.join(missing)} (make test-remote installs them)")
    if not pack.is_pulled(PRESETS[PRESET]):
        pytest.skip(f"{PRESET} is not pulled (run `draftwise models pull {PRESET}`)")
    return pack.preset_dir(PRESETS[PRESET]) / PRESETS[PRESET].gguf_name


@pytest.fixture(scope="module")
def engine(remote_gguf, tmp_path_factory):
    """A running engine for one test module."""
    server = LlamaServer(remote_gguf, tmp_path_factory.mktemp("engine"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def make_engine(remote_gguf, tmp_path_factory):
    """Engines a test starts (and stops) itself, e.g. with an API key."""
    started: list[LlamaServer] = []

    def make(api_key: str | None = None) -> LlamaServer:
        server = LlamaServer(remote_gguf, tmp_path_factory.mktemp("engine"), api_key=api_key)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A workspace folder for one module's sessions."""
    return tmp_path_factory.mktemp("workspace")


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """Documents outside the workspace: no other file joins their prompt, so prompts are predictable."""
    return tmp_path_factory.mktemp("outside")


@contextlib.asynccontextmanager
async def remote_session(target: str, workspace: Path, max_tokens: int):
    """A `draftwise serve` session on a remote target, ready; no time cap: the tests compare whole
    answers and cancel long ones."""
    from lsp_harness import client_capabilities, lsp_session, wait_for_state

    async with lsp_session(["--target", target], workspace=workspace,
                           capabilities=client_capabilities(encodings=["utf-16"]),
                           initialization_options={"maxTokens": max_tokens, "maxTimeMs": 0}) as (client, _):
        s = await wait_for_state(client)
        assert s["state"] == "ready", s
        yield client


def configure(client, **settings) -> None:
    from lsprotocol import types

    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"draftwise": settings}))


async def cancel_once_decoding(client, uri: str, text: str, msg_id: str, decoding) -> float:
    """Ask for an inline completion at the end of `text` (one line), send `$/cancelRequest` once
    `decoding()` says the engine is generating, and check the answer is RequestCancelled. Returns when
    the cancel was sent (time.monotonic())."""
    import asyncio

    from lsp_harness import inline_params
    from lsprotocol import types
    from pygls.exceptions import JsonRpcException

    started = time.monotonic()
    pending = asyncio.ensure_future(client.protocol.send_request_async(
        types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, 0, len(text)), msg_id=msg_id))
    while not decoding():
        assert time.monotonic() - started < 60, "the engine never started decoding"
        if pending.done():
            raise AssertionError(f"the request ended before it was cancelled: {pending.result()}")
        await asyncio.sleep(0.05)
    client.cancel_request(types.CancelParams(id=msg_id))
    cancelled_at = time.monotonic()
    with pytest.raises(JsonRpcException) as err:
        await asyncio.wait_for(pending, timeout=10)
    assert err.value.code == REQUEST_CANCELLED
    return cancelled_at
