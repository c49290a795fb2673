"""The replay's llama.vim driver: the context it sends and caches by, what it shows, and its request
discipline (no request while one is in flight, a cache hit shown at once and followed by a
speculative request). The server here is a small HTTP stand-in that answers /infill from a script:
the real llama-server takes ~7 minutes to build, so it runs in `draftwise replay`, not in tests."""
from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.replay.editor import Document, FileResult, TypingSession
from bench.replay.keystrokes import plan_keystrokes
from bench.replay.llama_vim import LLAMA_VIM, LlamaVimBackend, fim_context, rendered

PREFIX = "def f(x):\n    "
REGION = "y = x + 1\n    z = y * 2\n    return z"
SUFFIX = "\n\nprint(f(1))\n"


def test_the_context_is_the_lines_around_the_cursor_and_a_blank_line_starts_at_column_zero():
    doc = Document("file:///f.py", "python", "a = 1\ndef f(x):\n    ret\nprint(f(1))\n", len("a = 1\ndef f(x):\n    re"))
    ctx = fim_context(doc)
    assert (ctx.prefix, ctx.middle, ctx.suffix) == ("a = 1\ndef f(x):\n", "    re", "t\nprint(f(1))\n\n")
    assert ctx.indent == 4 and ctx.line_cur_suffix == "t"
    blank = Document("file:///f.py", "python", "def f(x):\n    \n", len("def f(x):\n    "))
    ctx = fim_context(blank)
    assert (ctx.prefix, ctx.middle, ctx.indent) == ("def f(x):\n", "", 0)
    # As if a shown suggestion were accepted: its lines join the prefix.
    after = fim_context(doc, ["turn x", "x = 2"], last_indent=4)
    assert after.prefix == "a = 1\ndef f(x):\n    return x\n" and after.middle == "x = 2" and after.indent == 4
    assert len(set(ctx.hashes())) == len(ctx.hashes()) >= 1


def test_what_is_shown_drops_repeats_of_the_following_text_and_brings_its_own_indentation():
    doc = Document("file:///f.py", "python", "def f(x):\n    \n    return x\n", len("def f(x):\n    "))
    assert rendered("    y = x\n\n", doc) == "y = x"  # the line's indentation is already there
    assert rendered("    return x", doc) is None  # the next line again
    assert rendered("   \n", doc) is None
    mid = Document("file:///f.py", "python", "print(x)\n", len("print("))
    assert rendered("x)", mid) is None  # what follows the cursor already
    assert rendered("x, y", mid) == "x, y"


class _Infill(BaseHTTPRequestHandler):
    """The stand-in: after `delay_s`, the next characters the user will type, per the prompt."""

    delay_s = 0.15
    log: list[tuple[float, dict]] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.log.append((time.monotonic(), body))
        time.sleep(self.delay_s)
        whole = "    " + REGION
        done = body["input_prefix"][len("def f(x):\n"):] + body["prompt"]
        rest = whole[len(done):] if whole.startswith(done) else "#"
        payload = json.dumps({"content": rest[:8]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_one_request_at_a_time_cache_hits_shown_at_once_and_followed_by_a_speculative_request():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Infill)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Infill.log = []
    backend = LlamaVimBackend("llama-server", "model.gguf")
    backend.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        doc = Document("file:///w/f.py", "python", PREFIX + SUFFIX, len(PREFIX))
        plan = plan_keystrokes(REGION, random.Random(5), 4.0)
        result = FileResult("f.py", "python", LLAMA_VIM.name, len(REGION))
        TypingSession(backend, doc, REGION, plan, LLAMA_VIM, result, 4.0).run()
    finally:
        server.shutdown()
    sent = [t for t, _ in _Infill.log]
    # Never two in flight: each request starts after the previous one's answer (delay_s) came back.
    assert all(b - a >= _Infill.delay_s * 0.9 for a, b in zip(sent, sent[1:])), sent
    assert len(sent) < result.chars, "typing while a request is in flight sends nothing new"
    assert result.shown >= 1 and result.accepted >= 1, "right answers from the cache are shown and taken"
    speculative = [b for _, b in _Infill.log if b["t_max_predict_ms"] == 1000]
    assert speculative, "a shown suggestion is followed by a request as if it were accepted"
    assert all(b["cache_prompt"] and b["samplers"] == ["top_k", "top_p", "infill"] for _, b in _Infill.log)
    assert doc.text == PREFIX + REGION + SUFFIX


def test_without_a_llama_server_binary_the_run_is_reported_as_not_run(tmp_path):
    from types import SimpleNamespace

    from bench.replay.cli import _llama_vim_setup
    from bench.llama_server import find_llama_server

    missing = str(tmp_path / "llama-server")
    assert find_llama_server(missing) is None
    status = _llama_vim_setup(SimpleNamespace(llama_server=missing, target="qwen2.5-coder-0.5b"))
    assert "no llama-server binary" in status["reason"] and "make setup-llama-server" in status["reason"]
    present = tmp_path / "bin" / "llama-server"
    present.parent.mkdir()
    present.write_text("")
    assert find_llama_server(str(present)) == str(present)
