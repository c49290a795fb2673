"""The `llamacpp:` backend (llama.cpp's native /infill) against llama.cpp's own `llama-server` on the
offline Qwen2.5-Coder-0.5B GGUF, through the real `draftwise serve` over LSP: the suggestion is the
server's own answer cut by the stop rules, and `$/cancelRequest` stops the server's generation.

Skipped without a llama-server binary (`make llama-server` builds one, ~7 minutes on 2 cores).
"""
from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import time
from pathlib import Path

import pytest
import pytest_asyncio

from conftest import PRESET, cancel_once_decoding, configure, free_port, remote_session
from lsp_harness import inline_params, open_document, stats

pytestmark = [pytest.mark.remote, pytest.mark.asyncio(loop_scope="module")]

MAX_TOKENS = 48
LONG = 400
FIB = "def fib(n):\n    \"\"\"The n-th Fibonacci number.\"\"\"\n"
PRIMES = "PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29,"  # the model lists primes for hundreds of tokens
START_TIMEOUT_S = 180.0


class LlamaServerProcess:
    """llama-server on the GGUF with one slot (so /slots describes the one generation running)."""

    def __init__(self, binary: str, gguf: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port), "-c", "4096", "-np", "1",
             "-t", "2", "-tb", "2"], stdout=open(log, "ab"), stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "llama-server exited while loading"
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"llama-server was not ready within {START_TIMEOUT_S:.0f} s")

    def slot(self) -> dict:
        import httpx

        return httpx.get(self.url + "/slots", timeout=10).json()[0]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    from decoding.models import pack
    from decoding.models.specs import PRESETS
    from lsp_server.replay.llama_vim import find_llama_server

    binary = find_llama_server()
    if binary is None:
        pytest.skip("no llama-server binary (on PATH or next to this Python): `make llama-server` builds one")
    if importlib.util.find_spec("httpx") is None:
        pytest.skip("the remote tests need httpx (make test-remote installs it)")
    if not pack.is_pulled(PRESETS[PRESET]):
        pytest.skip(f"{PRESET} is not pulled (run `draftwise models pull {PRESET}`)")
    server = LlamaServerProcess(binary, pack.preset_dir(PRESETS[PRESET]) / PRESETS[PRESET].gguf_name,
                                tmp_path_factory.mktemp("llama-server") / "server.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(llama_server, tmp_path_factory):
    async with remote_session(f"llamacpp:{llama_server.url}#?timeout=180", tmp_path_factory.mktemp("workspace"),
                              MAX_TOKENS) as client:
        yield client


async def test_the_suggestion_is_the_servers_own_infill_answer_cut_by_the_stop_rules(client, llama_server, outside):
    import httpx

    from decoding.stop_rules import StopRules
    from lsp_server.postprocess import detect_indent, shape

    uri = (outside / "fib.py").as_uri()
    text = FIB + "\n\nprint(fib(10))\n"
    open_document(client, uri, text)
    before = await stats(client)
    [item] = (await client.text_document_inline_completion_async(inline_params(uri, 2, 0))).items
    assert item.insert_text.strip()

    # The server's whole greedy answer to the same fields, asked directly (no prompt cache: the LSP
    # request above was the server's first, read cold as this one is).
    prefix, suffix = FIB, text[len(FIB):]
    raw = httpx.post(llama_server.url + "/infill", timeout=180, json={
        "input_prefix": prefix, "input_suffix": suffix, "input_extra": [], "prompt": "", "n_predict": MAX_TOKENS,
        "temperature": 0, "top_k": 1, "top_p": 1.0, "repeat_penalty": 1.0, "cache_prompt": False}).json()["content"]
    rules = StopRules.for_request(prefix, suffix, "python", "auto")
    cut = rules.check(raw)
    expected = raw[:cut] if cut is not None else raw[:rules.finish(raw)]
    assert item.insert_text == shape(expected, "", "", detect_indent(text)).text

    s = await stats(client)
    assert s["requests"] == before["requests"] + 1
    assert s["last"]["drafter"] == "remote" and s["last"]["stopped"] in ("stop_rule", "eos", "max_tokens")
    assert s["remote"]["health"] == "ok" and s["fimTemplate"] == "llama.cpp /infill"


async def test_cancel_request_stops_the_servers_generation_within_a_second(client, llama_server, outside):
    configure(client, maxTokens=LONG, scope="full")
    try:
        uri = (outside / "primes.py").as_uri()
        open_document(client, uri, PRIMES)
        cancelled_at = await cancel_once_decoding(
            client, uri, PRIMES, "cancel-llama-server",
            lambda: llama_server.slot()["is_processing"] and llama_server.slot()["next_token"][0]["n_decoded"] >= 5)
        while llama_server.slot()["is_processing"]:
            assert time.monotonic() - cancelled_at < 1.0, "llama-server went on generating after the cancel"
            await asyncio.sleep(0.02)
        decoded = llama_server.slot()["next_token"][0]["n_decoded"]
        assert decoded < LONG // 2, f"the server decoded {decoded} of {LONG} tokens"
    finally:
        configure(client, maxTokens=MAX_TOKENS, scope="auto")
