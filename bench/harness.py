"""Runs every mode on every case with one loaded engine, then the typing and cancel measurements.

Fairness rules:
- Every mode of a case sees the same prompt token ids (`Engine.build_prompt`), the same target
  weights (the Hugging Face baselines use the engine's loaded models), greedy decoding, the same
  end tokens and the same token limit. Engine requests use scope "full": the model's raw output up
  to an end token or the limit, with none of the code-aware stop rules, exactly what `generate`
  returns. Where the prefix ends in a blank the engine heals it (decoding/healing.py); `generate`
  gets the same constraint as a logits processor, and llama.cpp the prompt with its blanks, as its
  own users do.
- Each mode comparison request starts cold: stored KV caches are dropped before it and its document
  key is unique, so no mode benefits from another mode's prefill.
- Modes run case by case (all modes of case 1, then of case 2, ...), so a change in machine load
  hits every mode alike.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from bench.corpus import Case
from bench.hf_baselines import GenerateTiming, cut_at_end
from bench.llama_server import (
    PLAIN_ON, SMALL_MODEL_PLAIN, LlamaServerProcess, Variant, find_llama_quantize, find_llama_server, gguf_file_type,
    requantized_gguf, timing_from_server,
)
from bench.metrics import (
    ALL_MODES, ENGINE_MODES, HF_MODES, LLAMA_SERVER, LLAMACPP_MODES, RunRecord, check_goals, draft_model_verdict, median,
    completion_quality, cursor_kind, paired_difference, percentile, prompt_reading, quality_summary, remote_key,
    split_key, summarize,
)
from decoding.healing import Constraint, without_healed
from decoding.remote.backends import SPECULATION_COUNTERS

log = logging.getLogger("draftwise.bench")

TIMING_METHOD = (
    "decode tok/s counts only tokens made after the prompt's prefill: for the engine, decode_ms and the "
    "tokens of its verify loop (the prefill feeds the prompt minus its last token); for transformers "
    "generate and llama.cpp, whose prefill forward also yields the first token, the time from the first "
    "token to the last and the tokens after the first (first token time from a streamer / the token "
    "generator). Tokens are counted up to and including the end token; draft tokens a speculative "
    "step accepted past it are not counted. An inference server's rows (remote@...) take prefill and "
    "decode times and token counts from the server's /metrics where it has them (vLLM), else from "
    "its stream as it arrives; llama-server's rows (llama-server@...) from its own timings (tokens after "
    "the first over its predicted_ms, prefill its prompt_ms). Prompt reading is the prompt tokens a row read "
    "in its prefill time over that time: for the engine the prompt less the tail its first verify forward "
    "reads (one token on int8 and int4), for llama-server its prompt_n, which is what its own /infill "
    "prompt held less what its slot had cached (nothing: the slot is erased). End-to-end latency is wall time "
    "around one request; every request starts cold (no KV cache kept from earlier requests; llama-server's slot is "
    "erased before each, though its ngram-mod pool lives on across requests)."
)


# What an inference server's /metrics say about the requests it ran (vLLM's names; a server without
# them is timed from its stream on the client).
SERVER_COUNTERS = {"prefill_s": "vllm:request_prefill_time_seconds_sum",
                   "decode_s": "vllm:request_decode_time_seconds_sum",
                   "generated": "vllm:generation_tokens_total",
                   **SPECULATION_COUNTERS}  # drafted, accepted


@dataclass
class BenchSettings:
    max_tokens: int = 48
    modes: Sequence[str] = ALL_MODES
    repeats: int = 1
    lookup_tokens: int = 10  # the Hugging Face and llama.cpp prompt lookup length (their usual setting)
    typing_cases: int = 2
    keystrokes: int = 3
    typing_prompt_tokens: int = 1000
    typing_drafter: str = "auto"
    cancel_tries: int = 6
    llamacpp_threads: int | None = None
    seed: int = 0
    llama_goal: float = 1.3  # auto's decode speed over llama.cpp plain that counts as met
    # the `remote` mode's inference servers (decoding/remote): (label, target) pairs; one row each,
    # `remote@LABEL` (`remote` alone for one unlabelled server)
    remote_targets: Sequence[tuple[str, str]] = ()
    # llama.cpp's server as a peer (bench/llama_server.py): its variants, one row each, and
    # the binary (None: found on PATH or beside this Python)
    llama_server: Sequence = ()
    llama_server_binary: str | None = None
    # llama.cpp's formats the plain variant also runs on, requantized from the target's GGUF by
    # llama-quantize (None: found on PATH or beside this Python)
    llama_server_quants: Sequence[str] = ()
    llama_quantize_binary: str | None = None


@dataclass
class BenchResult:
    runs: dict[str, dict[str, RunRecord]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # mode -> why it did not run
    typing: dict | None = None
    cancel: dict | None = None
    quality_runs: dict[str, dict[str, RunRecord]] = field(default_factory=dict)  # format -> case -> record


def _request(case: Case, mode: str, document: str, max_tokens: int, scope: str = "full",
             prefix: str | None = None, draft_hint: str = ""):
    from decoding.api import CompletionRequest

    return CompletionRequest(prefix=case.prefix if prefix is None else prefix, suffix=case.suffix, path=case.path,
                             document=document, language=case.language, max_tokens=max_tokens, scope=scope,
                             drafter=mode, temperature=0.0, draft_hint=draft_hint)


def _decode_text(tokenizer, ids: Sequence[int]) -> str:
    # the engine's own decoding of its output, so texts compare equal when the tokens do
    return tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


@dataclass
class Completion:
    text: str  # what the user would get
    useful_tokens: int  # new tokens up to and including the end token
    stopped: str


def completion_of(models, ids: Sequence[int], healed: str = "") -> Completion:
    """What the engine makes of these new token ids under scope "full": everything up to the
    first end token (the raw output), decoded the engine's way (the healed blank left out); an
    unfinished UTF-8 sequence at the very end is not text yet, as in the engine."""
    kept, ended = cut_at_end(ids, models.end_ids)
    body = kept[:-1] if ended else kept
    text = without_healed(healed, _decode_text(models.tokenizer, body)).rstrip("\ufffd")
    return Completion(text, len(kept), "eos" if ended else "max_tokens")


def record_from_timing(mode: str, case: Case, g: GenerateTiming, done: Completion, speculative: bool) -> RunRecord:
    drafted, accepted = g.draft_counts(len(g.token_ids)) if speculative else (0, 0)
    return RunRecord(
        mode=mode, case_id=case.id, language=case.language, text=done.text, prompt_tokens=g.prompt_tokens,
        generated_tokens=done.useful_tokens, decode_tokens=max(0, done.useful_tokens - g.first_chunk_tokens),
        prefill_ms=g.prefill_ms, first_token_ms=g.first_token_ms, decode_ms=g.decode_ms, total_ms=g.total_ms,
        target_forwards=g.target_forwards_after_first, drafted_tokens=drafted, accepted_tokens=accepted,
        stopped=done.stopped,
    )


def engine_useful_tokens(result) -> int:
    """The engine reports the tokens it kept (none past the end token); the end token itself was a
    forward's work too, and `generate` counts it."""
    s = result.stats
    return s.generated_tokens + (1 if s.stopped == "eos" else 0)


def engine_prefill_tokens(engine, record: RunRecord) -> int:
    """The prompt tokens the engine read within its prefill_ms: the prompt less what its cache held,
    less the tail the first verify forward reads with the first draft (as Runner.sync leaves them:
    one token on the static forward, up to 16 on llama.cpp's runner)."""
    runner = getattr(getattr(engine, "models", None), "target_runner", None)
    tail = getattr(runner, "prompt_tail", 1)
    keep = min(record.reused_prompt_tokens, record.prompt_tokens - 1)
    return max(0, record.prompt_tokens - keep - max(1, min(tail, record.prompt_tokens - keep)))


def run_engine_mode(engine, case: Case, mode: str, max_tokens: int, document: str) -> RunRecord:
    """document: unique per run, so no run starts from another's stored cache."""
    engine.clear_caches()
    req = _request(case, mode, document, max_tokens)
    started = time.perf_counter()
    result = engine.complete(req)
    total_ms = (time.perf_counter() - started) * 1000
    s = result.stats
    useful = engine_useful_tokens(result)
    return RunRecord(
        mode=mode, case_id=case.id, language=case.language, text=result.text, prompt_tokens=s.prompt_tokens,
        reused_prompt_tokens=s.reused_prompt_tokens, generated_tokens=useful, decode_tokens=useful,
        prefill_ms=s.prefill_ms, first_token_ms=s.first_token_ms, decode_ms=s.decode_ms, total_ms=total_ms,
        target_forwards=s.target_forwards, drafted_tokens=s.drafted_tokens, accepted_tokens=s.accepted_tokens,
        drafted_by=dict(s.drafted_by), decisions=dict(s.decisions), stopped=s.stopped,
    )


def llamacpp_probe(gguf: str, timeout_s: float = 120) -> str | None:
    """Load the GGUF and decode a few tokens in a child process; None if fine, else why not.

    A llama.cpp build can crash the whole process (e.g. CPU features the build enabled but the
    machine does not allow), and the benchmark should report that instead of dying with it.
    """
    code = (
        "import sys\nfrom llama_cpp import Llama\n"
        "llm = Llama(model_path=sys.argv[1], n_ctx=256, verbose=False)\n"
        "ids = llm.tokenize(b'def add(a, b):\\n    return', add_bos=False)\n"
        "for i, t in enumerate(llm.generate(ids, top_k=1, temp=0.0)):\n"
        "    if i >= 2: break\n"
        "print('ok')\n"
    )
    try:
        proc = subprocess.run([sys.executable, "-c", code, gguf], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"llama.cpp did not decode a token within {timeout_s:.0f} s"
    if proc.returncode == 0 and "ok" in proc.stdout:
        return None
    if proc.returncode < 0:
        return (f"llama.cpp crashed (signal {-proc.returncode}) decoding with {gguf}; its build may use CPU "
                "features this machine does not allow (rebuild with CMAKE_ARGS=\"-DGGML_NATIVE=OFF ...\")")
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return f"llama.cpp failed: {tail[0]}"


class Bench:
    """engine: one Engine (modes are plain names: `auto`), or {weight format: Engine} (modes are
    `auto@int8`; the first format is the one typing and cancel are measured with). reference: the
    fp32 engine whose models the Hugging Face baselines run (default: the fp32 one, else the first).
    quality_cases: more cases, only to score completion quality per format."""

    def __init__(self, engine, cases: Sequence[Case], settings: BenchSettings,
                 progress: Callable[[str], None] | None = None, target_spec: str = "", reference=None,
                 quality_cases: Sequence[Case] = (), quality_reference: dict[str, RunRecord] | None = None):
        """quality_reference: fp32's scored records of these cases from an earlier run (case id ->
        record; see read_quality_reference), used where fp32 does not run in this one."""
        self.engines = dict(engine) if isinstance(engine, dict) else {None: engine}
        self.quality_reference = quality_reference or {}
        self.engine = next(iter(self.engines.values()))
        self.reference = reference or self.engines.get("fp32") or self.engine
        self.cases = list(cases)
        self.quality_cases = list(quality_cases)
        self.s = settings
        self.progress = progress or (lambda label: None)
        self.target_spec = target_spec
        self.result = BenchResult()
        self.llama = None  # LlamaCppWorker, started on first use
        self.llama_note: str | None = None
        self.remotes: dict = {}  # row key -> remote engine, loaded when the `remote` mode is planned
        self.llama_servers: dict = {}  # row key -> the llama-server process it asks (LlamaServerProcess)
        self.llama_server_info: dict | None = None  # which binary, threads, flags and GGUF formats those rows ran
        self.kernels: dict = {}  # weight format -> what ran the engine's rows (Engine.info()'s kernel)
        self.tag = f"{os.getpid()}-{int(time.time())}"

    # ---- which modes can run ----------------------------------------------------------------
    def plan_modes(self) -> list[str]:
        from bench import llamacpp_baselines

        wanted = [m for m in ALL_MODES if m in self.s.modes]
        runnable = []
        has_draft = self.engine.models.draft is not None
        for m in wanted:
            if m in ENGINE_MODES and (m != "model" or has_draft):
                runnable += [m if fmt is None else f"{m}@{fmt}" for fmt in self.engines]
                continue
            if m in ("hf-assisted", "model") and not has_draft:
                note = self.engine.models.draft_note or "no --draft model given"
                self.result.skipped[m] = f"needs a draft model ({note})"
                continue
            if m == "remote":
                runnable += self._load_remotes()
                continue
            if m == LLAMA_SERVER:
                runnable += self._start_llama_servers()
                continue
            if m in LLAMACPP_MODES:
                if not llamacpp_baselines.available():
                    self.result.skipped[m] = "llama-cpp-python is not installed (pip install 'draftwise[llamacpp]')"
                    continue
                gguf = llamacpp_baselines.gguf_for(self.target_spec)
                if gguf is None:
                    self.result.skipped[m] = f"no GGUF file for target {self.target_spec}"
                    continue
                if self.llama_note is None:
                    self.llama_note = llamacpp_probe(str(gguf)) or ""
                if self.llama_note:
                    self.result.skipped[m] = self.llama_note
                    continue
            runnable.append(m)
        if "hf-plain" not in runnable:
            raise ValueError("hf-plain is the reference every speedup is measured against; keep it in --modes")
        return runnable

    def _load_remotes(self) -> list[str]:
        """Load a remote engine per --remote server (its tokenizer; the server must answer); the rows
        that can run. A server that cannot is a skipped row, with why."""
        if not self.s.remote_targets:
            self.result.skipped["remote"] = ("no --remote TARGET given (an inference server, e.g. "
                                             "openai:http://host:8000/v1#model)")
        rows = []
        for label, target in self.s.remote_targets:
            key = remote_key(label)
            why = self._load_remote(key, target)
            if why:
                self.result.skipped[key] = why
            else:
                rows.append(key)
        return rows

    def _start_llama_servers(self) -> list[str]:
        """One llama-server per --llama-server variant on the target's GGUF (draft-plain: the draft
        model's), and with --llama-server-quants a plain one on each other format, requantized from that
        GGUF; each a remote engine on its /infill; the rows that can run. A row that cannot is a skipped
        row, with why."""
        from decoding.models.checkpoint import gguf_file

        if not self.s.llama_server:
            self.result.skipped[LLAMA_SERVER] = "no --llama-server LIST given (e.g. plain,ngram-mod)"
            return []
        binary = find_llama_server(self.s.llama_server_binary)
        gguf = gguf_file(self.target_spec)
        config = self.engine.config
        draft_gguf = gguf_file(config.draft) if config.draft and config.draft != "none" else None
        rows = []
        threads = self.s.llamacpp_threads or os.cpu_count() or 1
        shipped = gguf_file_type(gguf) if gguf is not None else None  # read from the file, not assumed
        self.llama_server_info = {"binary": binary and os.path.basename(binary), "gguf": gguf and gguf.name,
                                  "gguf_type": shipped, "threads": threads, "variants": {}, "formats": {}}
        for variant in self.s.llama_server:
            key = f"{LLAMA_SERVER}@{variant.label}"
            if binary is None:
                self.result.skipped[key] = "no llama-server binary (make setup-llama-server, or --llama-server-binary)"
                continue
            if gguf is None and variant.name != SMALL_MODEL_PLAIN:
                self.result.skipped[key] = f"no GGUF file for target {self.target_spec}"
                continue
            try:
                flags, model = variant.flags(draft_gguf), variant.model(gguf, draft_gguf)
            except ValueError as exc:
                self.result.skipped[key] = str(exc)
                continue
            # files by name: a JSON kept in the repository names no machine's folders
            shown = [Path(f).name if draft_gguf is not None and f == str(draft_gguf) else f for f in flags]
            if self._start_llama_server(key, binary, model, flags, threads,
                                        shown if model == gguf else ["-m", model.name, *shown]):
                self.llama_server_info["formats"][key] = {"type": shipped if model == gguf else gguf_file_type(model),
                                                          "requantized": False}
                rows.append(key)
        return rows + self._start_requantized_servers(binary, gguf, shipped, threads)

    def _start_requantized_servers(self, binary: str | None, gguf: Path | None, shipped: str | None,
                                   threads: int) -> list[str]:
        """--llama-server-quants: the plain variant on each listed format but the shipped file's (that
        row is `llama-server@plain`), requantized from the shipped file once (bench/llama_server.py)."""
        quants = [q for q in self.s.llama_server_quants if q != shipped]
        if not quants or Variant("plain") not in self.s.llama_server:
            return []
        quantize = find_llama_quantize(self.s.llama_quantize_binary)
        rows = []
        for quant in quants:
            key = f"{LLAMA_SERVER}@{PLAIN_ON}{quant}"
            if binary is None:
                self.result.skipped[key] = "no llama-server binary (make setup-llama-server, or --llama-server-binary)"
                continue
            if gguf is None:
                self.result.skipped[key] = f"no GGUF file for target {self.target_spec}"
                continue
            if quantize is None:
                self.result.skipped[key] = "no llama-quantize binary to make it (make setup-llama-quantize)"
                continue
            print(f"draftwise bench: {gguf.name} as {quant} (llama-quantize, once)", file=sys.stderr)
            try:
                model = requantized_gguf(gguf, quant, quantize, threads)
            except RuntimeError as exc:
                self.result.skipped[key] = str(exc)
                continue
            if self._start_llama_server(key, binary, model, [], threads, ["-m", model.name]):
                self.llama_server_info["formats"][key] = {"type": gguf_file_type(model), "requantized": True,
                                                          "from": shipped or gguf.name}
                rows.append(key)
        return rows

    def _start_llama_server(self, key: str, binary: str, model: Path, flags: list[str], threads: int,
                            shown: list[str]) -> bool:
        """Start one llama-server on `model` and a remote engine on it, for row `key`; False (the row
        skipped, with why) if either fails. shown: its flags as the JSON keeps them."""
        config = self.engine.config
        server = LlamaServerProcess(binary, model, flags, threads,
                                    ctx_size=max(4096, 2 * config.context_tokens + self.s.max_tokens))
        self.llama_servers[key] = server  # from here on close() stops it, whatever happens
        try:
            url = server.start()
        except RuntimeError as exc:
            self.result.skipped[key] = str(exc)
            del self.llama_servers[key]
            return False
        # the deadline of a cold prompt read on a slow CPU, not an editor's
        why = self._load_remote(key, f"llamacpp:{url}#?timeout=600")
        if why:
            self.llama_servers.pop(key).stop()
            self.result.skipped[key] = why
            return False
        self.llama_server_info["variants"][key] = shown
        return True

    def _load_remote(self, key: str, target: str) -> str | None:
        from dataclasses import replace

        from decoding.remote import is_remote_target

        if not is_remote_target(target):
            return f"--remote {target} is not openai:URL#MODEL or llamacpp:URL"
        engine = None
        try:
            from decoding.remote.remote_engine import RemoteEngine

            engine = RemoteEngine(replace(self.engine.config, target=target, max_tokens=self.s.max_tokens))
            engine.load()
        except Exception as exc:  # noqa: BLE001 - reported as a skipped mode
            if engine is not None:
                engine.close()  # its client thread
            return f"the remote engine did not load: {exc}".splitlines()[0]
        if engine.problem:
            engine.close()
            return engine.problem
        self.remotes[key] = engine
        return None

    def _llama(self):
        from bench.llamacpp_baselines import LlamaCppWorker, gguf_for

        if self.llama is None:
            n_ctx = self.engine.config.context_tokens + self.s.max_tokens + 64
            self.llama = LlamaCppWorker(gguf_for(self.target_spec), n_ctx, self.s.lookup_tokens,
                                        self.s.llamacpp_threads)
        return self.llama

    # ---- one case, one mode -----------------------------------------------------------------
    def run_mode(self, case: Case, key: str, prompt: list[int], run: str = "") -> RunRecord:
        """key: a mode, `mode@format` for engine modes. run: what makes this run's document key
        unique among runs of the same case and mode."""
        from bench.hf_baselines import generate_timed

        mode, fmt = split_key(key)
        e = self.reference
        try:
            if mode in ("remote", LLAMA_SERVER):  # the same request as the engine modes; the server runs it
                return self._run_remote(case, key, run)
            if mode in ENGINE_MODES:
                rec = run_engine_mode(self.engines[fmt], case, mode, self.s.max_tokens,
                                      f"bench://{self.tag}/{run}/{key}/{case.id}")
                rec.mode = key
                rec.prefill_tokens = engine_prefill_tokens(self.engines[fmt], rec)
                return rec.score(case.expected)
            request = _request(case, "none", "bench://prompt", self.s.max_tokens)
            healed = e.models.prompt_parts(request).healed
            if mode in HF_MODES:
                kw = {}
                if mode == "hf-assisted":
                    kw["assistant_model"] = e.models.draft.model
                elif mode == "hf-lookup":
                    kw["prompt_lookup_num_tokens"] = self.s.lookup_tokens
                if healed:
                    kw["healing"] = Constraint(e.models.healing, healed)
                # on the engines' model thread: a second thread running torch would slow every engine
                # row (decoding/jobs.py ModelWorker)
                g = e.on_model_thread(lambda: generate_timed(e.models.target.model, prompt, self.s.max_tokens,
                                                             e.models.end_ids, **kw))
            else:  # llama.cpp reads the prompt with its blanks, as its own users' prompts are
                healed, prompt = "", e.models.prompts.build_request(request).ids
                g = self._llama().generate(mode == "llamacpp-lookup", prompt, self.s.max_tokens, e.models.end_ids)
            done = completion_of(e.models, g.token_ids, healed)
            return record_from_timing(mode, case, g, done, mode not in ("hf-plain", "llamacpp-plain")).score(case.expected)
        except Exception as exc:  # one failing mode must not lose the rest of the run
            if isinstance(exc, KeyboardInterrupt):
                raise
            log.exception("mode %s failed on %s", mode, case.id)
            return RunRecord(mode=mode, case_id=case.id, language=case.language,
                             error=f"{type(exc).__name__}: {exc}".splitlines()[0])

    def _run_remote(self, case: Case, key: str, run: str) -> RunRecord:
        """Timed by the server where its /metrics say how long prefill and decoding took (vLLM): a
        stream may hand over several tokens at once, so arrival times on the client would not tell
        decoding speed. Its own draft and accepted tokens come from there too (the bench is the
        server's only client)."""
        engine = self.remotes[key]
        if key in self.llama_servers:
            self.llama_servers[key].forget()  # cold, as every engine row is
        before = engine.server_counters_now(SERVER_COUNTERS) or {}
        # the request as a user's (drafter `auto`): what drafting happens is the server's own
        rec = run_engine_mode(engine, case, "auto", self.s.max_tokens, f"bench://{self.tag}/{run}/{key}/{case.id}")
        rec.mode = key
        after = engine.server_counters_now(SERVER_COUNTERS) or {}
        grew = {name: after[name] - before[name] for name in after if name in before}
        if "drafted" in grew and "accepted" in grew:
            rec.drafted_tokens, rec.accepted_tokens = int(grew["drafted"]), int(grew["accepted"])
        if grew.get("decode_s", 0) > 0 and grew.get("generated", 0) > 1:
            # tokens after the first, over the time from the first to the last, as for llama.cpp
            rec.decode_tokens, rec.decode_ms = int(grew["generated"]) - 1, grew["decode_s"] * 1000
            rec.prefill_ms = grew.get("prefill_s", 0.0) * 1000
            # the forwards after the first token: one a token, less those its speculation got free
            rec.target_forwards = max(1, int(grew["generated"] - 1 - grew.get("accepted", 0)))
        server = (engine.stats().get("last") or {}).get("server") or {}
        mode, variant = split_key(key)
        if mode == LLAMA_SERVER:
            speculative = variant not in ("plain", SMALL_MODEL_PLAIN) and not variant.startswith(PLAIN_ON)
            timed = timing_from_server(server, speculative)
            for name, value in (timed or {}).items():  # llama-server's own clock, as vLLM's /metrics above
                setattr(rec, name, value)
            if timed is None and rec.stopped != "error":  # cut off before its last event: no clock to read
                rec.error = f"no timings from llama-server (the request ended: {rec.stopped})"
        if rec.stopped == "error":
            rec.error = (engine.stats().get("last") or {}).get("error") or "the server failed"
        return rec.score(case.expected)

    def warm_up(self, modes: Sequence[str]) -> None:
        """One short untimed run per implementation: first calls pay one-time setup costs."""
        case = self.cases[0]
        prompt = self.engine.build_prompt(_request(case, "none", "bench://warmup", 4))
        saved = self.s.max_tokens
        self.s.max_tokens = 4
        try:
            firsts = [m for m in modes if split_key(m)[0] == "none"]
            remotes = [m for m in modes if split_key(m)[0] in ("remote", LLAMA_SERVER)]
            for m in firsts + ["hf-plain", "hf-assisted", "llamacpp-plain", "llamacpp-lookup"] + remotes:
                if m in modes:
                    self.run_mode(case, m, prompt, "warmup")
        finally:
            self.s.max_tokens = saved

    def run_cases(self, modes: Sequence[str]) -> None:
        runs = self.result.runs
        for case in self.cases:
            prompt = self.engine.build_prompt(_request(case, "none", "bench://prompt", self.s.max_tokens))
            for mode in modes:
                self.progress(f"{mode} {case.language}:{case.kind}")
                best = None
                for rep in range(self.s.repeats):
                    rec = self.run_mode(case, mode, prompt, f"repeat{rep}")
                    # best of the repeats: noise on a shared machine only ever adds time
                    if best is None or (rec.ok and (not best.ok or rec.total_ms < best.total_ms)):
                        best = rec
                runs.setdefault(mode, {})[case.id] = best
        # read from the engines that ran the rows: a kernel that did not build here leaves torch's code
        # running, and the label says which
        self.kernels = {fmt: engine.info().get("kernel") for fmt, engine in self.engines.items() if engine is not None}

    # ---- quality --------------------------------------------------------------------------------
    def run_quality(self, modes: Sequence[str]) -> None:
        """Each extra quality case once per weight format (drafter auto: the same text as plain
        decoding, sooner) and by llama.cpp's Q4 when it runs; scored against the removed code."""
        out = self.result.quality_runs
        anchors = [m for m in ("llamacpp-plain",) if m in modes]
        for case in self.quality_cases:
            prompt = self.engine.build_prompt(_request(case, "none", "bench://prompt", self.s.max_tokens))
            for fmt in list(self.engines):
                self.progress(f"quality {fmt} {case.language}")
                key = "auto" if fmt is None else f"auto@{fmt}"
                out.setdefault(fmt or "engine", {})[case.id] = self.run_mode(case, key, prompt, "quality")
            for m in anchors:
                self.progress(f"quality {m}")
                out.setdefault(m, {})[case.id] = self.run_mode(case, m, prompt, "quality")

    def _quality_records(self, fmt: str) -> dict:
        """case id -> its scored record under `fmt` (timed plain runs and quality runs)."""
        if fmt == "fp32" and "fp32" not in self.engines and self.quality_reference:
            return self.quality_reference
        timed = self.result.runs.get(f"none@{fmt}" if fmt != "llamacpp-plain" else fmt, {})
        return {**timed, **self.result.quality_runs.get(fmt, {})}

    def quality(self) -> dict | None:
        """Per weight format (and llama.cpp's Q4): quality over the timed cases (their plain-decoding
        text) and the extra quality cases, with the gate's verdict against fp32."""
        records = {("llamacpp-q4" if fmt == "llamacpp-plain" else fmt): self._quality_records(fmt)
                   for fmt in [f for f in list(self.engines) if f is not None] + ["llamacpp-plain"]}
        records = {fmt: recs for fmt, recs in records.items() if recs}
        table = quality_table(records, self.quality_reference)
        if table and "fp32" not in records and self.quality_reference:
            table["formats"]["fp32"]["from"] = "an earlier run (--quality-reference)"
        return table

    # ---- typing -------------------------------------------------------------------------------
    def typing_cases(self) -> list[Case]:
        """Cases whose prefix gives a prompt of about `typing_prompt_tokens` tokens (cut at a line)."""
        out = []
        pool = [c for c in self.cases if c.language == "python"] + [c for c in self.cases if c.language != "python"]
        for case in pool:
            if len(out) >= self.s.typing_cases:
                break
            lines = case.prefix.split("\n")
            prompt_len = lambda k: len(self.engine.build_prompt(
                _request(case, "none", "bench://sizing", 8, prefix="\n".join(lines[k:]))))
            if prompt_len(0) < self.s.typing_prompt_tokens:
                continue
            lo, hi = 0, len(lines) - 1  # find the fewest lines dropped that fit the size
            while lo < hi:
                mid = (lo + hi) // 2
                if prompt_len(mid) <= self.s.typing_prompt_tokens:
                    hi = mid
                else:
                    lo = mid + 1
            out.append(Case(**{**case.__dict__, "prefix": "\n".join(lines[lo:])}))
        return out

    def run_typing(self) -> dict | None:
        cases = self.typing_cases()
        if not cases:
            return {"note": f"no case has a prefix of {self.s.typing_prompt_tokens} prompt tokens"}
        sequences = []
        for case in cases:
            for drafter in (self.s.typing_drafter, "none"):
                self.progress(f"typing {drafter} {case.language}")
                sequences.append(self._typing_sequence(case, drafter))
        whole = [self._cold_whole(case) for case in cases]
        main = [s for s in sequences if s["drafter"] == self.s.typing_drafter]
        kv_only = [s for s in sequences if s["drafter"] == "none"]
        cold = median(s["cold_ms"] for s in main)
        warm = median(w["ms"] for s in main for w in s["warm"])
        cold_none = median(s["cold_ms"] for s in kv_only)
        warm_none = median(w["ms"] for s in kv_only for w in s["warm"])
        consistent = [w["continues_suggestion"] for s in main for w in s["warm"]]
        return {
            "cold_ms": _r(cold), "warm_ms": _r(warm),
            "warm_over_cold": _r(warm / cold if warm is not None and cold else None, 3),
            "drafter": self.s.typing_drafter,
            "kv_reuse_only": {"cold_ms": _r(cold_none), "warm_ms": _r(warm_none),
                              "warm_over_cold": _r(warm_none / cold_none if warm_none is not None and cold_none else None, 3)},
            "warm_continues_suggestion_rate": _r(sum(consistent) / len(consistent), 3) if consistent else None,
            # a whole suggestion from a cold cache: this prompt, max_tokens new tokens (unless it ends)
            "cold_whole_ms": _r(median(w["ms"] for w in whole)), "cold_whole": whole,
            "prompt_tokens": [s["prompt_tokens"] for s in main],
            "keystrokes": self.s.keystrokes,
            "sequences": sequences,
        }

    def _cold_whole(self, case: Case) -> dict:
        e = self.engine
        self.progress(f"cold suggestion {case.language}")
        e.clear_caches()
        req = _request(case, self.s.typing_drafter, f"bench://{self.tag}/cold/{case.id}", self.s.max_tokens)
        t0 = time.perf_counter()
        res = e.complete(req)
        return {"case": case.id, "ms": round((time.perf_counter() - t0) * 1000, 1),
                "prompt_tokens": res.stats.prompt_tokens, "new_tokens": engine_useful_tokens(res)}

    def _typing_sequence(self, case: Case, drafter: str) -> dict:
        e = self.engine
        doc = f"bench://{self.tag}/typing/{drafter}/{case.id}"
        e.clear_caches()
        req = _request(case, drafter, doc, e.config.max_tokens, scope="auto")
        t0 = time.perf_counter()
        cold = e.complete(req)
        cold_ms = (time.perf_counter() - t0) * 1000
        suggestion = cold.text
        warm = []
        for k in range(1, self.s.keystrokes + 1):
            if k >= len(suggestion):
                break
            typed = suggestion[:k]
            # the rest of the shown suggestion, as the LSP server passes it while the user types along
            req = _request(case, drafter, doc, e.config.max_tokens, scope="auto", prefix=case.prefix + typed,
                           draft_hint=suggestion[k:])
            t0 = time.perf_counter()
            res = e.complete(req)
            ms = (time.perf_counter() - t0) * 1000
            s = res.stats
            warm.append({
                "typed": typed, "ms": round(ms, 1), "reused_prompt_tokens": s.reused_prompt_tokens,
                "prompt_tokens": s.prompt_tokens, "target_forwards": s.target_forwards,
                "accepted_from_suggestion": s.accepted_by.get("suggestion", 0),
                "continues_suggestion": suggestion[k:].startswith(res.text) or res.text.startswith(suggestion[k:]),
            })
        return {"case": case.id, "drafter": drafter, "cold_ms": round(cold_ms, 1),
                "prompt_tokens": cold.stats.prompt_tokens, "suggestion": suggestion, "warm": warm}

    # ---- cancel -------------------------------------------------------------------------------
    def run_cancel(self) -> dict:
        """Cancel running requests at moments spread over prefill and decode; count the target
        forwards that still finished after the cancel (the one in flight may)."""
        e = self.engine
        case = max(self.cases, key=lambda c: len(c.prefix))
        mode = self.s.typing_drafter
        e.clear_caches()
        calib = e.complete(_request(case, mode, f"bench://{self.tag}/cancel/calibrate", self.s.max_tokens))
        prefill_s = calib.stats.prefill_ms / 1000
        per_forward_s = calib.stats.decode_ms / 1000 / max(1, calib.stats.target_forwards)
        rng = random.Random(self.s.seed)
        tries = []
        for i in range(self.s.cancel_tries):
            self.progress("cancel")
            e.clear_caches()
            # the first try lands inside the prefill, the rest inside the decode loop
            delay = prefill_s * 0.5 if i == 0 else prefill_s + per_forward_s * (1 + rng.random() * 6)
            req = _request(case, mode, f"bench://{self.tag}/cancel/{i}", 4 * self.s.max_tokens)
            job = e.submit(req)
            time.sleep(delay)
            t_cancel = time.perf_counter()
            job.cancel()
            res = job.result()
            latency = (time.perf_counter() - t_cancel) * 1000
            tries.append({"delay_ms": round(delay * 1000, 1), "stopped": res.stats.stopped,
                          "forwards_after_cancel": res.stats.forwards_after_cancel,
                          "cancel_to_result_ms": round(latency, 1), "target_forwards": res.stats.target_forwards})
        cancelled = [t for t in tries if t["stopped"] == "cancelled"]
        after = [t["forwards_after_cancel"] for t in cancelled]
        lat = [t["cancel_to_result_ms"] for t in cancelled]
        return {
            "forwards_after_cancel_p95": _r(percentile(after, 95), 2),
            "forwards_after_cancel_max": max(after) if after else None,
            "cancel_to_result_ms_p50": _r(percentile(lat, 50)), "cancel_to_result_ms_p95": _r(percentile(lat, 95)),
            "tries": tries, "cancelled_tries": len(cancelled), "drafter": mode,
            "per_forward_ms": round(per_forward_s * 1000, 1),
        }

    # ---- everything ---------------------------------------------------------------------------
    def run(self) -> BenchResult:
        modes = self.plan_modes()
        try:
            self.warm_up(modes)
            self.run_cases(modes)
            self.run_quality(modes)
        finally:
            self.close()
        if self.s.typing_cases > 0:
            self.result.typing = self.run_typing()
        if self.s.cancel_tries > 0:
            self.result.cancel = self.run_cancel()
        return self.result

    def close(self) -> None:
        """Stop what the run started (llama.cpp's process, servers, remote clients); safe to repeat."""
        if self.llama is not None:
            self.llama.close()
            self.llama = None
        for remote in self.remotes.values():
            remote.close()
        for key, server in self.llama_servers.items():
            rss = server.rss_mib()  # after its rows: what it held serving them
            if rss is not None and self.llama_server_info is not None:
                self.llama_server_info.setdefault("rss_mib", {})[key] = rss
            server.stop()
        self.remotes, self.llama_servers = {}, {}

    def steps(self, modes_count: int) -> int:
        typing = self.s.typing_cases * 3 if self.s.typing_cases > 0 else 0
        quality = len(self.quality_cases) * (len(list(self.engines)) + 1)
        return len(self.cases) * modes_count + quality + typing + max(0, self.s.cancel_tries)


def _r(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(x, nd)


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem, "os": platform.platform(),
            "python": platform.python_version()}
    try:
        import torch
        import transformers

        info.update(torch=torch.__version__, transformers=transformers.__version__,
                    torch_threads=torch.get_num_threads(), cpu_capability=torch.backends.cpu.get_cpu_capability())
    except ImportError:
        pass
    from bench import llamacpp_baselines

    info["llama_cpp_python"] = llamacpp_baselines.version()
    return info


def build_report_data(bench: Bench, modes_order: Sequence[str], config: dict) -> dict:
    res = bench.result
    modes = [m for m in modes_order if m in res.runs] + [m for m in res.runs if m not in modes_order]
    summary = summarize(res.runs, modes)
    formats = (bench.llama_server_info or {}).get("formats", {})
    for key, s in summary.items():
        mode, fmt = split_key(key)
        if mode in ENGINE_MODES and fmt in bench.kernels:
            s["kernel"] = bench.kernels[fmt]
        elif key in formats:  # the GGUF format llama-server read, and whether the bench requantized it
            s["gguf"] = formats[key]
    quality = bench.quality()
    primary = next(iter(bench.engines))
    return {
        "modes": summary,
        "prompt_reading": prompt_reading(summary),
        "quality": quality,
        "typing": res.typing,
        "cancel": res.cancel,
        "draft_model": draft_model_verdict(summary, primary),
        "goals": check_goals(summary, res.typing, res.cancel, quality=quality, weights=primary,
                             llama_goal=bench.s.llama_goal, serve_rss=config.get("serve_rss_mib")),
        "skipped_modes": res.skipped,
        "config": {**config, "llama_server": bench.llama_server_info,
                   "kernels": {fmt or "engine": kernel for fmt, kernel in bench.kernels.items()},
                   "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                   "machine": machine_info(), "timing_method": TIMING_METHOD},
        "cases": [c.to_dict() for c in bench.cases],
        "quality_cases": [c.to_dict() for c in bench.quality_cases],
        "runs": {m: [r.to_dict() for r in res.runs[m].values()] for m in modes},
        "quality_runs": {f: [r.to_dict() for r in recs.values()] for f, recs in res.quality_runs.items()},
    }


def quality_table(records: dict[str, dict[str, RunRecord]], fp32: dict[str, RunRecord] | None = None,
                  versus: str = "fp32") -> dict | None:
    """row (a weight format, or `model@format` when models are compared) -> its scored records (case id
    -> record) -> the quality table: per row first-line exact and similarity, and against the `versus`
    row's records of the same cases the paired difference; against one model's fp32 (`versus_fp32`)
    also the gate's verdict. fp32: fp32's records where `records` has none (an earlier run's)."""
    from decoding.models.quality_gate import MAX_DROP_POINTS

    fp32 = records.get("fp32") or fp32 or {}
    if fp32 and "fp32" not in records:
        records = {"fp32": fp32, **records}
    table = {fmt: quality_summary(r for r in recs.values() if r.ok) for fmt, recs in records.items()}
    if not table:
        return None
    gate = versus == "fp32"
    against = fp32 if gate else records.get(versus, {})
    # The gate: a format stays out of `auto` only when the 95% interval of its paired difference
    # from fp32 lies wholly below -MAX_DROP_POINTS (decoding/models/quality_gate.py).
    reference = table.get(versus, {}).get("first_line_exact")
    for fmt, q in table.items():
        if reference is not None and q["first_line_exact"] is not None:
            q["drop_points"] = round(reference - q["first_line_exact"], 1)
        if fmt == versus or not against:
            continue
        paired = paired_difference(records[fmt], against)
        if paired is not None:
            q["versus_fp32" if gate else "versus"] = paired
            if gate:
                q["passes_gate"] = paired["ci95"][1] >= -MAX_DROP_POINTS
            for kind, per_kind in q.get("by_kind", {}).items():  # the same pairing, one cursor kind's cases
                mine = {c: r for c, r in records[fmt].items() if cursor_kind(r) == kind}
                per_kind["versus"] = paired_difference(mine, against)
    return {"max_drop_points": MAX_DROP_POINTS, "formats": table, "versus": versus,
            "cases": max((q["quality_cases"] for q in table.values()), default=0),
            "method": "first line of the raw completion equal to the removed code's first line (trailing "
                      "spaces aside; where the removed code starts with a line break, its lines up to the first "
                      "with code); similarity: difflib ratio over as many lines as were removed; "
                      f"versus {versus}: paired difference with a 95% bootstrap interval and McNemar's exact test"}


def _records(rows: Sequence[dict]) -> dict[str, RunRecord]:
    names = {f.name for f in fields(RunRecord)}
    return {r["case_id"]: RunRecord(**{k: v for k, v in r.items() if k in names}) for r in rows}


def suffix_lines_of(config: dict) -> bool:
    """Whether a bench JSON's run showed the model the lines after the cursor (`suffix`); runs from
    before the setting showed the rest of the cursor's line."""
    shown = config.get("suffix")
    if isinstance(shown, str):  # a replay records the setting it passed
        return shown == "lines"
    return bool((shown or {}).get("lines", False))


def merge_quality_runs(paths: Sequence[str], versus: str | None = None) -> dict:
    """Several bench JSONs' scored records pooled per weight format into one quality table: each
    run's timed plain rows (`none@FORMAT`, llama.cpp's `llamacpp-plain`) and its quality runs. The
    runs must share the prompt and generation settings; a case scored by more than one run counts
    once (the first file's record). Runs of one model give the gate's table (each format against fp32).
    Runs of several models (the same cases, `--quality-reference`) compare the models: rows are
    `MODEL@FORMAT`, each paired with the `versus` row (default: the first file's model at fp32).
    A path given as `PATH=LABEL` puts its records in rows of their own, `ROW/LABEL` (the same model
    before and after a change). Every record is scored again against its case's removed code, so runs
    scored by an older rule compare with today's. Raises ValueError when the runs cannot be pooled."""
    merged: dict[str, dict[str, RunRecord]] = {}
    runs, languages = [], {}
    settings = ("max_tokens", "context_tokens")
    labels = {path.split("=", 1)[0]: (path.split("=", 1)[1] if "=" in path else "") for path in paths}
    loaded = [(path, json.loads(Path(path).read_text())) for path in labels]
    if not loaded:
        raise ValueError("no files given")
    targets = list(dict.fromkeys(data.get("config", {}).get("target") for _, data in loaded))
    if len(targets) > 1 and None in targets:  # models are told apart by the spec each run was given
        raise ValueError(f"{next(p for p, d in loaded if not d.get('config', {}).get('target'))} names no target model")
    first = None
    shown: dict[tuple, tuple[str, bool]] = {}  # (model, label) -> the first file's suffix choice
    for path, data in loaded:
        config = data.get("config", {})
        pooled = (config.get("target"), labels[path])
        lines = suffix_lines_of(config)
        if shown.setdefault(pooled, (path, lines))[1] != lines:
            raise ValueError(f"{path} showed {'the lines after the cursor' if lines else 'the rest of its line'} "
                             f"as the suffix, {shown[pooled][0]} not: label them apart (PATH=LABEL)")
        mine = {k: config.get(k) for k in settings}
        if first is None:
            first = (path, mine)
        elif mine != first[1]:
            differ = ", ".join(f"{k} {first[1][k]} against {mine[k]}" for k in settings if mine[k] != first[1][k])
            raise ValueError(f"{path} was run with other settings than {first[0]}: {differ}")
        label = f"/{labels[path]}" if labels[path] else ""
        row = (lambda fmt, label=label: fmt + label) if len(targets) == 1 else \
            (lambda fmt, t=config.get("target"), label=label: f"{t}@{fmt}{label}")
        listed = {c["id"]: c["language"] for c in data.get("cases", []) + data.get("quality_cases", [])}
        expected = {c["id"]: c["expected"] for c in data.get("cases", []) + data.get("quality_cases", []) if "expected" in c}
        per_format: dict[str, list[dict]] = {}
        for key, rows in data.get("runs", {}).items():
            if key == "llamacpp-plain":
                per_format.setdefault("llamacpp-q4", []).extend(rows)
            elif key.startswith("none@") and "+" not in key:
                per_format.setdefault(key.split("@", 1)[1], []).extend(rows)
        for fmt, rows in data.get("quality_runs", {}).items():
            per_format.setdefault("llamacpp-q4" if fmt == "llamacpp-plain" else fmt, []).extend(rows)
        if not per_format:
            raise ValueError(f"{path} has no scored records (no none@FORMAT rows or quality runs)")
        added = 0
        for fmt, rows in per_format.items():
            into = merged.setdefault(row(fmt), {})
            for case_id, record in _records(rows).items():
                if case_id in expected and record.ok:
                    record.first_line_exact, record.similarity = completion_quality(record.text, expected[case_id])
                if case_id not in into:
                    into[case_id] = record
                    languages.setdefault(case_id, listed.get(case_id, case_id.split(":", 1)[0]))
                    added += 1
        runs.append({"file": Path(path).name, "command": config.get("command"), "date": config.get("date"),
                     "target": config.get("target"), "records_added": added})
    versus = versus or ("fp32" if len(targets) == 1 else f"{targets[0]}@fp32")
    if versus not in merged and not (versus == "fp32" and len(targets) == 1):
        raise ValueError(f"no row {versus!r} to compare with (rows: {', '.join(merged)})")
    table = quality_table(merged, versus=versus)
    if table is None:
        raise ValueError("no scored records in " + ", ".join(paths))
    table["languages"] = dict(Counter(languages.values()).most_common())
    table["runs"] = runs
    target = targets[0] if len(targets) == 1 else targets
    return {"config": {"target": target, **first[1], "merged_from": runs}, "quality": table}


def read_quality_reference(path: str, target: str | None = None,
                           **settings) -> tuple[list[Case], list[Case], dict[str, RunRecord] | None]:
    """An earlier bench JSON's timed cases, quality cases and fp32's scored records of them (its timed
    `none@fp32` runs and its fp32 quality runs): fp32 is the slowest format, and greedy decoding of the
    same prompts gives the same text. A run of a model other than `target` gives its cases only (records
    None: another model's fp32 is no reference; `--quality-merge` compares the models). settings
    (max_tokens=..., context_tokens=...) must be the earlier run's. A case whose file this machine lacks
    (or holds in another version) is left out, with a warning: the rest still pair. Raises ValueError
    when the settings differ, no case can be read again, or fp32 lacks a case of the same model's run."""
    from bench.corpus import CorpusError, case_from_dict, default_roots, list_files

    data = json.loads(Path(path).read_text())
    config = data.get("config", {})
    for key, value in settings.items():
        if config.get(key) != value:
            raise ValueError(f"{path} was run with {key} {config.get(key)}, this run with {value}")
    listed = data.get("cases", []) + data.get("quality_cases", [])
    where = {}
    if any("source" not in d for d in listed):  # committed JSONs keep package paths, not machine paths
        languages = sorted({d["language"] for d in listed})
        where = {shown: source for files in list_files(default_roots(), languages).values() for source, shown in files}
    gone: list[str] = []

    def readable(listed_cases: list[dict]) -> list[Case]:
        out = []
        for d in listed_cases:
            try:
                out.append(case_from_dict(d, where))
            except CorpusError as exc:
                gone.append(str(exc))
        return out

    cases, quality_cases = readable(data.get("cases", [])), readable(data.get("quality_cases", []))
    if gone:
        if not cases and not quality_cases:
            raise ValueError(f"none of its {len(gone)} cases can be read here (e.g. {gone[0]})")
        log.warning("%s: %d of its %d cases are not on this machine, left out (e.g. %s)", path, len(gone),
                    len(listed), gone[0])
        if not cases:  # a run times at least one case
            cases, quality_cases = quality_cases[:1], quality_cases[1:]
    if target is not None and config.get("target") != target:
        return cases, quality_cases, None
    rows = list(data.get("runs", {}).get("none@fp32", [])) + list(data.get("quality_runs", {}).get("fp32", []))
    records = _records(rows)
    missing = [c.id for c in cases + quality_cases if c.id not in records]
    if missing:
        raise ValueError(f"{path} has no fp32 record of {len(missing)} of its cases (e.g. {missing[0]})")
    for case in cases + quality_cases:  # scored again: a run scored by an older rule pairs with today's
        record = records[case.id]
        if record.ok:
            record.first_line_exact, record.similarity = completion_quality(record.text, case.expected)
    return cases, quality_cases, {c.id: records[c.id] for c in cases + quality_cases}
