"""llama.cpp's own server as the benchmark's peer: `draftwise bench --llama-server plain,ngram-mod,...`.

Each variant is one `llama-server` process on loopback, started on the same GGUF file draftwise
converts its weights from, with the same threads, asked over `/infill` by the remote backend (the
server builds the fill-in-the-middle prompt itself, as it does for llama.vim and its other editor
clients). Rows are `llama-server@VARIANT`; a speculative variant's text is compared with
`llama-server@plain`'s, as draftwise's `auto@int8` is with `none@int8`.

Variants (llama.cpp's own names and defaults):
- `plain`: no speculation;
- `ngram-simple`, `ngram-mod`: `--spec-type` n-gram lookup over the prompt and what it generated;
- `draft`: `-md` the draft model's GGUF with `--spec-type draft-simple` (llama.cpp's default draft
  length); `draft:N` adds `--spec-draft-n-max N`;
- `draft-plain`: the draft model's GGUF as the model, no speculation: the small model's own speed,
  which a bigger target with speculation would match (its text is the small model's, so it is held
  against no other row's).

Timing comes from the server's own `timings` in its last event: `predicted_ms` runs from the end of
the prompt's read (which yields the first token) to the last token, so the row's decode speed is
`(predicted_n - 1) / predicted_ms`, the engine's rule (tokens after the first over the time from the
first to the last); its drafted and accepted tokens are `draft_n` and `draft_n_accepted`.
"""
from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

SMALL_MODEL_PLAIN = "draft-plain"  # the variant that decodes the draft model itself, plainly
VARIANTS = ("plain", "ngram-simple", "ngram-mod", "draft", SMALL_MODEL_PLAIN)
START_TIMEOUT_S = 300.0


def find_llama_server(explicit: str | None = None) -> str | None:
    """The llama-server binary: the one given, else on PATH, else next to this Python (a virtual
    environment's bin folder, where `make setup-llama-server` puts it)."""
    if explicit:
        return explicit if Path(explicit).is_file() else None
    found = shutil.which("llama-server")
    if found:
        return found
    beside = Path(sys.executable).with_name("llama-server")
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


@dataclass(frozen=True)
class Variant:
    name: str  # plain, ngram-simple, ngram-mod, draft, draft-plain
    draft_max: int | None = None  # draft:N

    @property
    def label(self) -> str:
        return self.name if self.draft_max is None else f"{self.name}:{self.draft_max}"

    def model(self, gguf: Path, draft_gguf: Path | None) -> Path:
        """The GGUF the server decodes: the target's, or the draft model's for draft-plain."""
        if self.name != SMALL_MODEL_PLAIN:
            return gguf
        if draft_gguf is None:
            raise ValueError("the draft-plain variant needs a draft model (--draft) with a GGUF file")
        return draft_gguf

    def flags(self, draft_gguf: Path | None) -> list[str]:
        if self.name in ("plain", SMALL_MODEL_PLAIN):
            return []
        if self.name in ("ngram-simple", "ngram-mod"):
            return ["--spec-type", self.name]
        if draft_gguf is None:
            raise ValueError("the draft variant needs a draft model (--draft) with a GGUF file")
        more = ["--spec-draft-n-max", str(self.draft_max)] if self.draft_max is not None else []
        return ["-md", str(draft_gguf), "--spec-type", "draft-simple", *more]


def parse_variants(text: str | None) -> tuple[Variant, ...]:
    """`plain,ngram-mod,draft:8` -> the variants, in order, without repeats; ValueError on a bad one."""
    out: list[Variant] = []
    for item in filter(None, (p.strip() for p in (text or "").split(","))):
        name, _, n = item.partition(":")
        if name not in VARIANTS:
            raise ValueError(f"--llama-server: {item!r} is not one of {', '.join(VARIANTS)} (draft:N sets its length)")
        if n and (name != "draft" or not n.isdigit() or int(n) < 1):
            raise ValueError(f"--llama-server: {item!r}: only draft takes a length, a positive number (draft:8)")
        v = Variant(name, int(n) if n else None)
        if v not in out:
            out.append(v)
    return tuple(out)


class LlamaServerProcess:
    """One llama-server on a free loopback port; its log kept in a temp file for a failed start."""

    def __init__(self, binary: str, gguf: Path, flags: list[str], threads: int, ctx_size: int) -> None:
        self.binary, self.gguf, self.flags = binary, gguf, flags
        self.threads, self.ctx_size = threads, ctx_size
        self.process: subprocess.Popen | None = None
        self.scratch = tempfile.TemporaryDirectory(prefix="llama-server-")
        self.log_path = Path(self.scratch.name) / "server.log"
        self.url = ""

    def command(self, port: int) -> list[str]:
        # One slot with the whole context: the benchmark is its only client, one request at a time.
        # A slot save path only so that forget() may erase the slot's cache (nothing is saved).
        return [self.binary, "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(port),
                "-t", str(self.threads), "-tb", str(self.threads), "--ctx-size", str(self.ctx_size),
                "-np", "1", "--slot-save-path", self.scratch.name, *self.flags]

    def start(self) -> str:
        """Start it and wait for /health; the server's URL. RuntimeError with its log's tail if it
        does not come up; the process never outlives a failed or interrupted start."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        try:
            # its own process group is left out on purpose: a Ctrl-C at the terminal stops it too
            with open(self.log_path, "wb") as log:
                self.process = subprocess.Popen(self.command(port), stdin=subprocess.DEVNULL, stdout=log,
                                                stderr=subprocess.STDOUT)
        except OSError as exc:
            raise RuntimeError(f"llama-server did not start: {exc}") from None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as reply:
                    # ours, not another process that took the port meanwhile: ours is still alive
                    if reply.status == 200 and self.process.poll() is None:
                        return self.url
            except (urllib.error.URLError, OSError, http.client.HTTPException):
                time.sleep(0.3)
        raise RuntimeError(f"llama-server did not come up ({self.log_tail()})")

    def forget(self) -> None:
        """Erase the slot's cached prompt: the next request is read cold, as the engine's rows are
        after `clear_caches`."""
        request = urllib.request.Request(self.url + "/slots/0?action=erase", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=10) as reply:
            reply.read()

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return " | ".join(text[-lines:]) or "no output"

    def rss_mib(self) -> float | None:
        """Its resident memory now, MiB (None when it is not running or psutil is missing)."""
        try:
            import psutil
        except ImportError:
            return None
        if self.process is None or self.process.poll() is not None:
            return None
        try:
            return round(psutil.Process(self.process.pid).memory_info().rss / 2**20, 1)
        except (OSError, psutil.Error):
            return None

    def stop(self) -> None:
        stop_process(self.process)
        self.scratch.cleanup()


def stop_process(process: subprocess.Popen | None, wait_s: float = 30) -> None:
    """Terminate a server we started and reap it; killed if it has not ended within wait_s."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def timing_from_server(server: dict, speculative: bool) -> dict | None:
    """The record fields the server's own timings give (None where it sent none): decode tokens and
    ms, prefill ms, forwards after the first token, drafted and accepted tokens (the server leaves
    them out when it drafted nothing)."""
    predicted_n, predicted_ms = server.get("predicted_n"), server.get("predicted_ms")
    if not predicted_n or predicted_ms is None:
        return None
    decode_tokens = int(predicted_n) - 1
    # the server counts a whole accepted draft before it stops at the end token or the limit
    drafted, accepted = int(server.get("draft_n", 0)), min(int(server.get("draft_n_accepted", 0)), decode_tokens)
    return {
        "decode_tokens": decode_tokens, "decode_ms": float(predicted_ms),
        "prefill_ms": float(server.get("prompt_ms") or 0.0),
        "reused_prompt_tokens": int(server.get("cache_n") or 0),  # prompt tokens its slot had cached
        "drafted_tokens": drafted if speculative else None,
        "accepted_tokens": accepted if speculative else None,
        # one forward a token after the first, less those its speculation got free
        "target_forwards": max(1, decode_tokens - accepted),
    }
