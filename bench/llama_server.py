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
first to the last); its drafted and accepted tokens are `draft_n` and `draft_n_accepted`. Its prompt
reading is `prompt_n` tokens (those its slot had not cached) in `prompt_ms`.

`--llama-server-quants q4_0,q8_0` also runs the plain variant on llama.cpp's other formats: the GGUF
requantized by llama.cpp's own `llama-quantize --allow-requantize` (`make setup-llama-quantize`), made
once into $DRAFTWISE_HOME/gguf. Rows `llama-server@plain:q4_0`; the shipped file's stays
`llama-server@plain`. A requantized file is made from the shipped Q4_K_M, not from the model's
16-bit weights: its speed is that format's, its text may be a little worse than a Q4_0 or Q8_0 made
from 16 bits.
"""
from __future__ import annotations

import http.client
import os
import shutil
import socket
import struct
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
    return _find_binary("llama-server", explicit)


def find_llama_quantize(explicit: str | None = None) -> str | None:
    """llama.cpp's llama-quantize, found as llama-server is (`make setup-llama-quantize` puts it beside
    this Python)."""
    return _find_binary("llama-quantize", explicit)


def _find_binary(name: str, explicit: str | None) -> str | None:
    if explicit:
        return explicit if Path(explicit).is_file() else None
    found = shutil.which(name)
    if found:
        return found
    beside = Path(sys.executable).with_name(name)
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


# llama.cpp's formats the plain variant may also run on, each with its number in a GGUF header's
# general.file_type (llama_ftype); llama-quantize takes the name upper-cased.
QUANT_TYPES = {"q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q3_k_m": 12, "q4_k_s": 14, "q4_k_m": 15,
               "q5_k_s": 16, "q5_k_m": 17, "q6_k": 18}
QUANTIZE_TIMEOUT_S = 1800.0  # far beyond what the presets take; a hung llama-quantize is not waited on forever
PLAIN_ON = "plain:"  # a plain row on a requantized GGUF: `llama-server@plain:q4_0`


def parse_quants(text: str | None) -> tuple[str, ...]:
    """`q4_k_m, Q4_0` -> ('q4_k_m', 'q4_0'), in order, without repeats; ValueError on an unknown one."""
    out: list[str] = []
    for item in filter(None, (p.strip().lower() for p in (text or "").split(","))):
        if item not in QUANT_TYPES:
            raise ValueError(f"--llama-server-quants: {item!r} is not one of {', '.join(QUANT_TYPES)}")
        if item not in out:
            out.append(item)
    return tuple(out)


_GGUF_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_file_type(path: Path) -> str | None:
    """The format a GGUF file says it holds (general.file_type in its header, which llama-quantize
    writes): a name of QUANT_TYPES, `type N` for another, None for a file that is not GGUF (v2 or later)
    or does not say. Reads the header only, up to that key."""
    names = {number: name for name, number in QUANT_TYPES.items()}
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                return None
            version, _tensors, kv_count = struct.unpack("<IQQ", f.read(20))
            if version < 2:  # v1 counted in 32 bits; no model of this project is that old
                return None
            for _ in range(kv_count):
                key = _gguf_string(f)
                (kind,) = struct.unpack("<I", f.read(4))
                if key == "general.file_type" and kind in (4, 5):
                    (number,) = struct.unpack("<I" if kind == 4 else "<i", f.read(4))
                    return names.get(number, f"type {number}")
                _skip_gguf_value(f, kind)
    except (OSError, struct.error, UnicodeDecodeError, ValueError):
        return None
    return None


def _gguf_string(f) -> str:
    (n,) = struct.unpack("<Q", f.read(8))
    raw = f.read(n)
    if len(raw) != n:
        raise ValueError("GGUF header cut short")
    return raw.decode("utf-8")


def _skip_gguf_value(f, kind: int) -> None:
    if kind == _GGUF_STRING:
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(n, os.SEEK_CUR)
    elif kind == _GGUF_ARRAY:
        item, count = struct.unpack("<IQ", f.read(12))
        if item in _GGUF_SCALAR_BYTES:
            f.seek(count * _GGUF_SCALAR_BYTES[item], os.SEEK_CUR)
        else:  # strings (a tokenizer's vocabulary) or nested arrays: one at a time
            for _ in range(count):
                _skip_gguf_value(f, item)
    elif kind in _GGUF_SCALAR_BYTES:
        f.seek(_GGUF_SCALAR_BYTES[kind], os.SEEK_CUR)
    else:
        raise ValueError(f"GGUF value of unknown type {kind}")


def requantized_gguf(source: Path, quant: str, binary: str, threads: int | None = None,
                     home: Path | None = None) -> Path:
    """`source` requantized to llama.cpp's format `quant` by llama-quantize, kept as
    $DRAFTWISE_HOME/gguf/<source's name>-<quant>.gguf and made only when missing or older than `source`
    (a preset pulled again). Written under a temporary name and renamed once whole, so an interrupted
    or failed run never leaves a file that looks made; what was made must say in its header that it is
    `quant`. RuntimeError with llama-quantize's last lines when it fails."""
    from decoding.home.paths import atomic_target, draftwise_home

    out = (home or draftwise_home()) / "gguf" / f"{source.stem}-{quant}.gguf"
    try:
        if out.stat().st_mtime >= source.stat().st_mtime and gguf_file_type(out) == quant:
            return out
    except OSError:
        pass
    with atomic_target(out) as tmp:
        command = [binary, "--allow-requantize", str(source), str(tmp), quant.upper(), str(threads or os.cpu_count() or 1)]
        try:
            done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                                  timeout=QUANTIZE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"llama-quantize did not run: {exc}") from None
        if done.returncode != 0:
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:]) or "no output"
            raise RuntimeError(f"llama-quantize failed to make {quant} (exit status {done.returncode}): {tail}")
        made = gguf_file_type(tmp)
        if made != quant:
            raise RuntimeError(f"llama-quantize was asked for {quant} and wrote {made or 'no GGUF file'}")
    return out


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
    ms, prefill ms and the prompt tokens it read in them (None where it does not say), forwards after
    the first token, drafted and accepted tokens (the server leaves them out when it drafted nothing)."""
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
        # what prompt_ms read: the prompt less what its slot had cached
        "prefill_tokens": int(server["prompt_n"]) if server.get("prompt_n") is not None else None,
        "drafted_tokens": drafted if speculative else None,
        "accepted_tokens": accepted if speculative else None,
        # one forward a token after the first, less those its speculation got free
        "target_forwards": max(1, decode_tokens - accepted),
    }
