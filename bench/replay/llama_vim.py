"""The peer's real path as a replay backend: llama.vim's editor logic talking to llama.cpp's
`llama-server` on `/infill`, on the same GGUF.

What llama.vim does (autoload/llama.vim, `llama#fim` and friends), and so what this backend does:

- on every cursor move in insert mode it asks for a completion at once (no debounce), unless a
  request is in flight: then it tries again 100 ms later; it never cancels a request it sent;
- it skips the request when more than 8 characters follow the cursor on its line;
- every answer goes to a cache keyed by the text around the cursor; a cursor move first looks there
  (also up to 128 characters back, when the typed characters match the cached text) and shows a hit
  at once, then asks for the next suggestion as if the shown one were accepted (speculative FIM);
- a first request may generate for 250 ms (`t_max_predict_ms`), a speculative one for 1000 ms;
- the prompt is the 256 lines before the cursor and the 64 after; the server builds the FIM prompt;
- it hides a suggestion that repeats the text after the cursor or the next line.

Left out: the ring buffer of chunks from other buffers (`input_extra`): the replay types one file at a
time, with no yanks or other buffers to gather chunks from, so it would stay empty here too.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import psutil

from bench.llama_server import stop_process
from bench.replay.editor import ClientProfile, Document, ReplayedSuggestion

# llama.vim's defaults (its s:default_config) and its request body.
N_PREFIX_LINES, N_SUFFIX_LINES, MAX_LINE_SUFFIX = 256, 64, 8
RETRY_S = 0.1  # "avoid sending repeated requests too fast": the timer while a request is in flight
CACHE_LOOKBACK = 128
LLAMA_VIM_REQUEST = {
    "input_extra": [], "n_predict": 128, "stop": [], "top_k": 40, "top_p": 0.90, "stream": False,
    "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
    "response_fields": ["content", "timings/prompt_n", "timings/predicted_n", "tokens_cached"],
}
FIRST_PREDICT_MS, SPECULATIVE_PREDICT_MS = 250, 1000
# llama.vim's README server command for FIM (the model is ours): flash attention, 1024-token batches,
# the model's whole context, and KV cache reuse by shifting.
SERVER_FLAGS = ["-fa", "on", "-ub", "1024", "-b", "1024", "--ctx-size", "0", "--cache-reuse", "256"]
SERVER_START_S = 300.0

# llama.vim has no debounce of its own and hides the suggestion on every cursor move (showing it
# again from its cache when the typed text matches).
LLAMA_VIM = ClientProfile("llama.vim", 0.0, False)


@dataclass(frozen=True)
class FimContext:
    """llama.vim's `s:fim_ctx_local`: the text around the cursor it sends and caches by."""

    prefix: str
    middle: str
    suffix: str
    indent: int
    line_cur_suffix: str

    def hashes(self) -> list[str]:
        """The cache keys of an answer: the context, and the same with 1-3 first lines dropped."""
        out, prefix = [_sha(self.prefix + self.middle + "Î" + self.suffix)], self.prefix
        for _ in range(3):
            prefix = prefix.split("\n", 1)[1] if "\n" in prefix else ""
            if not prefix:
                break
            out.append(_sha(prefix + self.middle + "Î" + self.suffix))
        return out


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _lines_and_cursor(doc: Document) -> tuple[list[str], int, int]:
    lines = doc.text.split("\n")
    y = doc.text.count("\n", 0, doc.cursor)
    x = doc.cursor - (doc.text.rfind("\n", 0, doc.cursor) + 1)
    return lines, x, y


def fim_context(doc: Document, prev: list[str] | None = None, last_indent: int = -1) -> FimContext:
    """The context at the cursor; with `prev` (a shown suggestion's lines), as if it were inserted."""
    lines, x, y = _lines_and_cursor(doc)
    after = lines[y + 1: y + 1 + N_SUFFIX_LINES]
    if not prev:
        line_cur = lines[y]
        before = lines[max(0, y - N_PREFIX_LINES): y]
        if line_cur.strip() == "":  # a line of whitespace: from its start
            indent, cur_prefix, cur_suffix = 0, "", ""
        else:
            indent = len(line_cur) - len(line_cur.lstrip())
            cur_prefix, cur_suffix = line_cur[:x], line_cur[x:]
    else:
        line_cur = lines[y][:x] + prev[0] if len(prev) == 1 else prev[-1]
        cur_prefix, cur_suffix = line_cur, ""
        before = lines[max(0, y - N_PREFIX_LINES + len(prev) - 1): y]
        if len(prev) > 1:
            before = before + [lines[y][:x] + prev[0], *prev[1:-1]]
        indent = last_indent
    return FimContext("\n".join(before) + "\n", cur_prefix, cur_suffix + "\n" + "\n".join(after) + "\n",
                      indent, cur_suffix)


def rendered(content: str, doc: Document) -> str | None:
    """llama.vim's `s:fim_render`: the text a cached answer shows at the cursor, or None when it
    shows nothing (empty, whitespace only, or repeating the text after the cursor or the next line)."""
    parts = content.split("\n")
    while parts and parts[-1] == "":
        parts.pop()
    if not parts:
        return None
    lines, x, y = _lines_and_cursor(doc)
    line_cur = lines[y]
    if line_cur.strip() == "":  # the answer brings its own indentation: drop what the line has
        lead = min(len(parts[0]) - len(parts[0].lstrip()), len(line_cur))
        line_cur, parts[0] = parts[0][:lead], parts[0][lead:]
    cur_prefix, cur_suffix = line_cur[:x], line_cur[x:]
    if len(parts) == 1 and parts[0] == cur_suffix:
        return None
    if len(parts) > 1 and parts[0] == "" and parts[1:] == lines[y + 1: y + len(parts)]:
        return None
    cmp_y = y + 1
    while cmp_y < len(lines) - 1 and lines[cmp_y].strip() == "":
        cmp_y += 1
    if cmp_y < len(lines) and cur_prefix + parts[0] == lines[cmp_y]:
        following = lines[cmp_y + 1:]
        if len(parts) == 1 or (len(parts) == 2 and following and following[0].startswith(parts[1])):
            return None
        if len(parts) > 2 and parts[1:] == following[: len(parts) - 1]:
            return None
    text = "\n".join(parts)
    return None if text.strip() == "" else text


class _Request:
    """One POST /infill on its own thread, as llama.vim's curl job."""

    def __init__(self, url: str, body: dict, hashes: list[str], done) -> None:
        self.hashes = hashes
        threading.Thread(target=self._run, args=(url, body, done), daemon=True).start()

    def _run(self, url: str, body: dict, done) -> None:
        content = None
        request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as reply:
                content = json.loads(reply.read()).get("content")
        except (urllib.error.URLError, OSError, ValueError):
            pass
        done(self, content)


@dataclass
class _Handle:
    shown: tuple[ReplayedSuggestion, float] | None  # a cache hit, on screen at once


class LlamaVimBackend:
    """editor.Backend: llama.vim's behaviour against a llama-server started on the GGUF."""

    def __init__(self, binary: str, gguf: str, threads: int | None = None) -> None:
        self.binary, self.gguf = binary, gguf
        self.threads = threads or os.cpu_count() or 1
        self.process: subprocess.Popen | None = None
        self.url = ""
        self.cache: dict[str, str] = {}
        self.in_flight: _Request | None = None
        self.retry: threading.Timer | None = None  # llama.vim's s:timer_fim
        self.last_indent = -1
        self.answered = threading.Event()  # an answer came back since the last look
        self.lock = threading.Lock()
        self.sent = 0

    # ---- the server ------------------------------------------------------------------------------
    def start(self) -> dict:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [self.binary, "-m", self.gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(self.threads),
             "-tb", str(self.threads), *SERVER_FLAGS],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as reply:
                    if reply.status == 200:
                        return {}  # nothing to report: the run's settings say what ran
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"llama-server did not come up on {self.gguf}")

    def cpu_seconds(self) -> float:
        times = psutil.Process(self.process.pid).cpu_times()
        return times.user + times.system

    def final_report(self) -> dict:
        return {"requests_sent": self.sent}

    def stop(self) -> None:
        if self.retry is not None:
            self.retry.cancel()
        stop_process(self.process)

    # ---- llama.vim ---------------------------------------------------------------------------------
    def _fim(self, doc: Document, prev: list[str] | None) -> None:
        """`llama#fim`: send a request for the cursor (or for after `prev`), unless one is in flight
        (then again in 100 ms) or the answer is cached already. Under the lock: the retry timer's
        thread calls it too, and there is never more than one request in flight."""
        with self.lock:
            if self.in_flight is not None:
                if self.retry is not None:
                    self.retry.cancel()
                self.retry = threading.Timer(RETRY_S, self._retry, (doc, doc.version, prev))
                self.retry.daemon = True
                self.retry.start()
                return
            ctx = fim_context(doc, prev, self.last_indent)
            if not prev and len(ctx.line_cur_suffix) > MAX_LINE_SUFFIX:
                return
            hashes = ctx.hashes()
            if any(h in self.cache for h in hashes):
                return
            self.last_indent = ctx.indent
            body = {**LLAMA_VIM_REQUEST, "input_prefix": ctx.prefix, "input_suffix": ctx.suffix,
                    "prompt": ctx.middle, "n_indent": ctx.indent,
                    "t_max_predict_ms": SPECULATIVE_PREDICT_MS if prev else FIRST_PREDICT_MS}
            self.in_flight = _Request(self.url + "/infill", body, hashes, self._on_response)
            self.sent += 1

    def _retry(self, doc: Document, version: int, prev: list[str] | None) -> None:
        """The timer fired (on its own thread, as Vim's timers run while the user types). A request
        for after a shown suggestion is moot once the document changed: that suggestion is gone."""
        if prev is None or doc.version == version:
            self._fim(doc, prev)

    def _on_response(self, request: _Request, content: str | None) -> None:
        with self.lock:
            if content:
                for h in request.hashes:
                    self.cache[h] = content
            self.in_flight = None
        self.answered.set()

    def _cached(self, doc: Document) -> str | None:
        """`s:fim_try_hint`'s lookup: the cached answer for the cursor, or for a cursor up to 128
        characters back when what was typed since matches its start (the longest rest wins)."""
        ctx = fim_context(doc)
        with self.lock:
            hit = self.cache.get(_sha(ctx.prefix + ctx.middle + "Î" + ctx.suffix))
            if hit is not None:
                return hit
            before, best = ctx.prefix + ctx.middle, None
            for i in range(min(CACHE_LOOKBACK, len(before))):
                content = self.cache.get(_sha(before[: len(before) - 1 - i] + "Î" + ctx.suffix))
                removed = before[len(before) - 1 - i:]
                if content and content.startswith(removed) and len(content) > len(removed):
                    rest = content[len(removed):]
                    if best is None or len(rest) > len(best):
                        best = rest
            return best

    def _show(self, doc: Document) -> tuple[ReplayedSuggestion, float] | None:
        """A cache hit rendered at the cursor, and the speculative request for after it."""
        content = self._cached(doc)
        text = rendered(content, doc) if content else None
        if text is None:
            return None
        self._fim(doc, text.split("\n"))
        return ReplayedSuggestion(text, doc.cursor, doc.cursor, None), time.monotonic()

    # ---- editor.Backend ----------------------------------------------------------------------------
    def open(self, doc: Document) -> None:
        self.cache.clear()  # a new file: nothing cached for it (llama.vim's cache is per session)

    def change(self, doc: Document, start: dict, end: dict, text: str) -> None:
        """llama.vim tells the server nothing about edits."""

    def request(self, doc: Document) -> Any:
        """The cursor moved (CursorMovedI): show a cached answer at once, else send a request."""
        handle = _Handle(self._show(doc))
        if handle.shown is None:
            self._fim(doc, None)
        return handle

    def cancel(self, handle: Any) -> None:
        """llama.vim does not cancel a request it sent; its answer goes to the cache."""

    def answer(self, handle: _Handle, doc: Document, deadline: float) -> tuple[ReplayedSuggestion | None, float] | None:
        if handle.shown is not None:
            return handle.shown
        while True:
            if self.answered.is_set():  # an answer came back: `s:fim_on_response` tries to show it
                self.answered.clear()
                shown = self._show(doc)
                if shown is not None:
                    return shown
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.answered.wait(timeout=left)

    def accepted(self, suggestion: ReplayedSuggestion) -> None:
        """Tab inserts the text; llama.vim sends nothing."""

    def close(self, doc: Document) -> None:
        """Nothing to tell the server."""
