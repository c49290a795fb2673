"""llama.cpp (through llama-cpp-python, an optional extra): plain greedy decoding and its prompt
lookup decoding, on the GGUF file of the same model, fed the exact prompt token ids the engine built.

Timing follows the rest of the benchmark: the first `eval` feeds the prompt (prefill); decode is
timed from the first generated token to the last and counts the tokens after the first. Forward
sizes come from wrapping the instance's `eval`, and drafted/accepted are derived from them as for
the Hugging Face modes (each eval after the first feeds one token plus the drafted ones).

llama.cpp runs in its own process (`LlamaCppWorker`, this module run with `-m`), as it does for
its users: in a process where PyTorch has run on another, still living thread (the engine's
worker), llama.cpp's OpenMP threads decoded about 30% slower here. The separate process also keeps
a crashing llama.cpp build from taking the benchmark down with it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from bench.hf_baselines import GenerateTiming


def available() -> bool:
    from decoding.models import llamacpp_model

    return llamacpp_model.available()


def version() -> str | None:
    if not available():
        return None
    import llama_cpp

    return getattr(llama_cpp, "__version__", "unknown")


def gguf_for(target_spec: str) -> Path | None:
    """The GGUF file of the target (see decoding.models.checkpoint.gguf_file)."""
    from decoding.models.checkpoint import gguf_file

    return gguf_file(target_spec)


class LlamaCppBaseline:
    """One llama.cpp instance; `lookup_tokens` > 0 gives it prompt lookup decoding."""

    def __init__(self, gguf: Path, n_ctx: int, lookup_tokens: int = 0, threads: int | None = None):
        from llama_cpp import Llama

        draft = None
        if lookup_tokens:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup_tokens)
        threads = threads or os.cpu_count() or 1
        # With a draft model llama-cpp-python verifies from every position's logits; it switches
        # logits_all on itself but sizes its score buffer from the argument, so pass it.
        self.llm = Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                         draft_model=draft, logits_all=draft is not None, verbose=False)
        self._positions: list[int] = []
        original_eval = self.llm.eval

        def counting_eval(tokens):
            self._positions.append(len(tokens))
            return original_eval(tokens)

        self.llm.eval = counting_eval  # generate() calls self.eval: count forwards and their sizes

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.llm.detokenize(list(ids)).decode("utf-8", errors="replace")

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, end_ids: set[int]) -> GenerateTiming:
        self.llm.reset()  # no reuse of the previous prompt's KV: every case starts cold
        self._positions = []
        out: list[int] = []
        first_t = None
        started = time.perf_counter()
        for tok in self.llm.generate(list(prompt_ids), top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                     repeat_penalty=1.0, reset=True):
            if first_t is None:
                first_t = time.perf_counter()
            out.append(int(tok))
            if tok in end_ids or len(out) >= max_new_tokens:
                break
        finished = time.perf_counter()
        first_t = first_t or finished
        return GenerateTiming(
            token_ids=out, first_chunk_tokens=1 if out else 0, prefill_ms=(first_t - started) * 1000,
            first_token_ms=(first_t - started) * 1000, decode_ms=(finished - first_t) * 1000,
            total_ms=(finished - started) * 1000, forward_positions=list(self._positions),
            prompt_tokens=len(prompt_ids),
        )

    def close(self) -> None:
        close = getattr(self.llm, "close", None)
        if close is not None:
            close()


class LlamaCppWorker:
    """llama.cpp in a child process: one plain and one prompt-lookup instance, created on first use."""

    def __init__(self, gguf: Path, n_ctx: int, lookup_tokens: int, threads: int | None = None):
        cmd = [sys.executable, "-m", "bench.llamacpp_baselines", str(gguf), str(n_ctx),
               str(lookup_tokens), str(threads or 0)]
        root = str(Path(__file__).resolve().parents[2])  # the child imports this package from here too
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        # llama.cpp logs to stderr; the benchmark's progress bar owns the terminal
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env)

    def generate(self, lookup: bool, prompt_ids: Sequence[int], max_new_tokens: int,
                 end_ids: set[int]) -> GenerateTiming:
        request = {"lookup": lookup, "ids": list(prompt_ids), "max_tokens": max_new_tokens, "end_ids": sorted(end_ids)}
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            code = self.proc.wait()
            how = f"signal {-code}" if code < 0 else f"exit status {code}"
            raise RuntimeError(f"the llama.cpp process ended ({how})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"llama.cpp: {reply['error']}")
        return GenerateTiming(**reply)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _serve(gguf: str, n_ctx: int, lookup_tokens: int, threads: int) -> None:
    """The child's loop: one JSON request per stdin line, one JSON reply per stdout line."""
    runners: dict[bool, LlamaCppBaseline] = {}
    for line in sys.stdin:
        req = json.loads(line)
        try:
            lookup = bool(req["lookup"])
            if lookup not in runners:
                runners[lookup] = LlamaCppBaseline(Path(gguf), n_ctx, lookup_tokens if lookup else 0, threads or None)
            timing = runners[lookup].generate(req["ids"], req["max_tokens"], set(req["end_ids"]))
            reply = dataclasses.asdict(timing)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which records the failed run
            reply = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    for r in runners.values():
        r.close()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
