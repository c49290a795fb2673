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
VLLM_START_TIMEOUT_S = 600.0  # vLLM's CPU build starts in ~2.5 minutes on 2 idle cores
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

    def decoded(self, since: float = 0.0) -> list[dict]:
        """The decode steps among evals(since): forward passes that fed one token."""
        return [e for e in self.evals(since) if e["tokens"] == 1]


class VllmServer:
    """vLLM's OpenAI-compatible server (its CPU build, from its own venv: DRAFTWISE_VLLM_PYTHON) on the
    0.5B pack, with its ngram speculation. stop() kills it like a crash; start() brings it back on the
    same port. Its /metrics tell what it is doing: the tests prove from the engine's side that a
    cancelled request stops generating."""

    SPECULATION = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}

    def __init__(self, python: str, model_dir: Path, workdir: Path, api_key: str | None = None,
                 speculation: bool = True) -> None:
        self.python, self.model_dir, self.workdir, self.api_key = python, model_dir, workdir, api_key
        self.speculation = speculation
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    url = LlamaServer.url
    target = LlamaServer.target

    def start(self, timeout_s: float = VLLM_START_TIMEOUT_S) -> None:
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
               "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", vllm_dtype(), "--max-model-len", "2048"]
        if self.speculation:
            cmd += ["--speculative-config", json.dumps(self.SPECULATION)]
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2"}
        preload = vllm_preload(self.python)
        if preload:  # vLLM's CPU docs: Intel OpenMP and tcmalloc, where they are installed
            env["LD_PRELOAD"] = ":".join(preload)
        log = open(self.workdir / "vllm.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        import httpx

        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}); see {self.workdir / 'vllm.log'}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError(f"vLLM was not ready within {timeout_s:.0f} s; see {self.workdir / 'vllm.log'}")

    def stop(self) -> None:
        LlamaServer.stop(self)

    def client_connections(self) -> dict[tuple[str, str], str]:
        """The TCP connections to this server from this machine, client ends, with their states as
        /proc/net lists them (01 established; 04, 05, 06, 0B: the client closed it; 08: the server
        did): draftwise's pooled and streaming ones. A cancelled answer's must close from our end."""
        port = f"{self.port:04X}"
        found = {}
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = Path(table).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                local, remote, state = line.split()[1:4]
                if remote.rsplit(":", 1)[1] == port:
                    found[(local, remote)] = state
        return found

    def metrics(self) -> dict[str, float]:
        """The engine's own counts: requests running, tokens generated, draft and accepted tokens."""
        import httpx

        from decoding.remote.backends import parse_counters

        names = {"running": "vllm:num_requests_running", "generated": "vllm:generation_tokens_total",
                 "drafted": "vllm:spec_decode_num_draft_tokens_total",
                 "accepted": "vllm:spec_decode_num_accepted_tokens_total"}
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        reply = httpx.get(f"http://127.0.0.1:{self.port}/metrics", headers=headers, timeout=5)
        reply.raise_for_status()
        return parse_counters(reply.text, names)


def vllm_dtype() -> str:
    """bf16 where the CPU computes it natively (AVX-512 BF16, as where these tests were run), else
    fp32, which vLLM's CPU build runs on any CPU; the tests compare with vLLM's own answers, so
    either dtype is right."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "float32"
    return "bfloat16" if " avx512_bf16" in flags else "float32"


def vllm_preload(python: str) -> list[str]:
    prefix = Path(python).resolve().parents[1]
    found = [str(p) for p in (prefix / "lib" / "libiomp5.so",) if p.exists()]
    for lib in ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"):
        if Path(lib).exists():
            found.append(lib)
            break
    return found


@pytest.fixture(scope="session")
def vllm_python() -> str:
    python = os.environ.get("DRAFTWISE_VLLM_PYTHON")
    if not python or not Path(python).exists():
        pytest.skip("the vLLM tests need vLLM's CPU build in its own venv: `make test-vllm` builds it")
    missing = [m for m in CLIENT_PACKAGES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the vLLM tests need {', '.join(missing)} (make test-vllm installs them)")
    if not pack.is_pulled(PRESETS[PRESET]):
        pytest.skip(f"{PRESET} is not pulled (run `draftwise models pull {PRESET}`)")
    return python


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
    try:
        answer = await asyncio.wait_for(pending, timeout=10)
    except JsonRpcException as err:
        assert err.code == REQUEST_CANCELLED, err
        return cancelled_at
    raise AssertionError(f"answered {time.monotonic() - cancelled_at:.2f} s after the cancel instead of "
                         f"RequestCancelled: {answer}")


def fim_answer(url: str, prefix: str, suffix: str, max_tokens: int, api_key: str | None = None,
               **sampling) -> str:
    """What an engine itself generates for draftwise's FIM prompt, asked directly (not streamed)."""
    import httpx  # a remote extra: imported here so `make test` collects these modules without it
    from transformers import AutoTokenizer

    from decoding.prompt import PromptBuilder

    tokenizer = AutoTokenizer.from_pretrained(str(pack.preset_dir(PRESETS[PRESET])))
    builder = PromptBuilder(tokenizer, 1536)
    prompt = tokenizer.decode(builder.build(prefix, suffix).ids, skip_special_tokens=False,
                              clean_up_tokenization_spaces=False)
    stop = [t for t in builder.template.end_tokens if t != builder.template.middle][:4]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    reply = httpx.post(f"{url}/completions", timeout=300, headers=headers, json={
        "model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "top_p": 1,
        "stop": stop, **sampling})
    reply.raise_for_status()
    return reply.json()["choices"][0]["text"]


async def check_type_ahead(client, outside: Path, text: str) -> None:
    """Typing the first character of a shown suggestion: the rest comes at once, without the engine.
    The engine is still asked, in the background; this returns once it has answered, so that its
    request does not run into the next test (llama-cpp-python's server cuts off one of two at once)."""
    from lsp_harness import inline_params, insert_change, open_document, stats, stats_until

    uri = (outside / "typeahead.py").as_uri()
    open_document(client, uri, text)
    [item] = (await client.text_document_inline_completion_async(inline_params(uri, 2, 0))).items
    suggestion = item.insert_text
    typed = suggestion[:len(suggestion) - len(suggestion.lstrip(" ")) + 1]  # up to its first character
    assert typed.strip() and "\n" not in typed, suggestion
    client.text_document_did_change(insert_change(uri, 2, 2, 0, typed))
    before = await stats(client)
    started = time.monotonic()
    [rest] = (await client.text_document_inline_completion_async(inline_params(uri, 2, len(typed)))).items
    took = time.monotonic() - started
    assert rest.insert_text == suggestion[len(typed):]
    assert took < 0.5, f"type-ahead waited for the engine ({took:.2f} s)"
    answered = await stats_until(client, lambda s: s["requests"] > before["requests"], timeout=120)
    assert answered["last"]["stopped"] != "error", answered["last"]


def shown_answer(raw: str, prefix: str, suffix: str, text: str) -> str:
    """An engine's whole answer as the editor gets it: cut where the stop rules say, shaped."""
    from decoding.stop_rules import StopRules
    from lsp_server.postprocess import detect_indent, shape

    rules = StopRules.for_request(prefix, suffix, "python", "auto")
    cut = rules.check(raw)
    return shape(raw[:cut] if cut is not None else raw[:rules.finish(raw)], "", "", detect_indent(text)).text
