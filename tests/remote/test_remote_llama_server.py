"""The `llamacpp:` backend (llama.cpp's native /infill) against llama.cpp's own `llama-server` on the
offline Qwen2.5-Coder-0.5B GGUF, through the real `draftwise serve` over LSP: the suggestion is the
server's own answer cut by the stop rules, and `$/cancelRequest` stops the server's generation.

Skipped without a llama-server binary (`make setup-llama-server` builds one, ~7 minutes on 2 cores).
"""
from __future__ import annotations

import asyncio
import importlib.util
import time

import pytest
import pytest_asyncio

from conftest import PRESET, cancel_once_decoding, configure, remote_session
from lsp_harness import inline_params, open_document, stats

pytestmark = [pytest.mark.remote, pytest.mark.asyncio(loop_scope="module")]

MAX_TOKENS = 48
LONG = 400
FIB = "def fib(n):\n    \"\"\"The n-th Fibonacci number.\"\"\"\n"
PRIMES = "PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29,"  # the model lists primes for hundreds of tokens


def slot(url: str) -> dict:
    """The server's one slot (it runs with -np 1, so this is the one generation running)."""
    import httpx

    return httpx.get(url + "/slots", timeout=10).json()[0]


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    from decoding.models import pack
    from decoding.models.specs import PRESETS
    from bench.llama_server import LlamaServerProcess, find_llama_server

    binary = find_llama_server()
    if binary is None:
        pytest.skip("no llama-server binary (on PATH or next to this Python): `make setup-llama-server` builds one")
    if importlib.util.find_spec("httpx") is None:
        pytest.skip("the remote tests need httpx (make test-remote installs it)")
    if not pack.is_pulled(PRESETS[PRESET]):
        pytest.skip(f"{PRESET} is not pulled (run `draftwise models pull {PRESET}`)")
    server = LlamaServerProcess(binary, pack.preset_dir(PRESETS[PRESET]) / PRESETS[PRESET].gguf_name, [],
                                threads=2, ctx_size=4096)
    try:
        server.start()
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
            lambda: slot(llama_server.url)["is_processing"] and slot(llama_server.url)["next_token"][0]["n_decoded"] >= 5)
        while slot(llama_server.url)["is_processing"]:
            assert time.monotonic() - cancelled_at < 1.0, "llama-server went on generating after the cancel"
            await asyncio.sleep(0.02)
        decoded = slot(llama_server.url)["next_token"][0]["n_decoded"]
        assert decoded < LONG // 2, f"the server decoded {decoded} of {LONG} tokens"
    finally:
        configure(client, maxTokens=MAX_TOKENS, scope="auto")

