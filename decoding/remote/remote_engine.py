"""The remote engine: the same methods the LSP layer calls on `decoding.engine.Engine`, served by an
inference server (see decoding/remote/__init__.py).

Each request runs as an asyncio task on the engine's own event loop thread:

- the prompt is draftwise's: the FIM prompt built with the model's tokenizer for /v1/completions
  (the same token budget and layout as in-process), or prefix, suffix and open files as the fields
  of llama.cpp's /infill;
- the answer streams in; the stop rules see the text after every chunk and the stream is closed as
  soon as one fires (the server stops generating when the connection closes);
- `cancel()` (a newer request for the document, an edit, `$/cancelRequest`) cancels the task, which
  closes the stream at once, whatever the server is doing; a client-side deadline does the same
  after `timeout` seconds (or the request's own time limit), because server-side abort has
  regressed in more than one engine;
- a failure never raises to the caller: the request ends with `stopped="error"` and the engine's
  health (reported in `stats()["remote"]`, and through `on_health` once per change) says what is
  wrong. The next request tries the server again, so completions resume as soon as it is back.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from decoding import faults
from decoding.api import CancelToken, CompletionRequest, CompletionResult, EngineConfig, Progress, RequestStats
from decoding.errors import DraftwiseError, EngineNotReady, ModelNotAvailable, ModelSpecError, check_request
from decoding.jobs import Job, JobRegistry
from decoding.prompt import valid_text
from decoding.stop_rules import completion_rules, kept_past_time_cap
from decoding.remote import backends
from decoding.remote.secrets import api_key_from_env
from decoding.remote.spec import RemoteSpec, parse_remote_target

log = logging.getLogger("draftwise.remote")

OK = "ok"
SUFFIX_CHARS = 1024  # /infill: the first characters after the cursor (the server fits them to its budget)
CHARS_PER_TOKEN = 3  # /infill: characters of prefix and other files per prompt token


@dataclass
class RemoteRequestStats(RequestStats):
    server: dict = field(default_factory=dict)  # what the server reported (usage, timings), when it did
    error: str = ""  # why the request failed (stopped == "error")


class RemoteJob(Job):
    """A Job whose cancel also closes its stream: cancelling the task ends the HTTP request, which
    makes the server stop generating."""

    tells_text = False  # its text arrives whole at the end (Job.saw is never called)

    def __init__(self, request: CompletionRequest, cancel: CancelToken | None = None, version: int = 0,
                 idle: bool = False):
        super().__init__(request, cancel, version, idle)
        self.reason = "cancelled"  # what the task's cancellation means: "cancelled" or "time_limit"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None

    def cancel(self) -> None:
        super().cancel()
        if faults.trip("remote_stream_left_open"):
            return  # a fault for tests: the cancel does not reach the stream, which is read to its end
        loop, task = self._loop, self._task
        log.debug("request cancelled (%s)", "its stream closes" if task is not None else "before it started")
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop has closed: the task is gone already
                pass


def _tokenizer_candidates(spec: RemoteSpec) -> list[str]:
    from decoding.models.specs import PRESETS

    if spec.tokenizer:
        return [spec.tokenizer]
    out = [spec.model]
    name = spec.model.lower().rsplit("/", 1)[-1]
    for preset in PRESETS:  # the family's tokenizer: the Qwen2.5-Coder sizes share one vocabulary
        if preset.rsplit("-", 1)[0] in name:
            out.append(preset)
    return list(dict.fromkeys(out))


def load_tokenizer(spec: RemoteSpec):
    """The model's tokenizer, for the FIM prompt (no model weights are loaded)."""
    from transformers import AutoTokenizer

    from decoding.models import pack
    from decoding.models.checkpoint import model_source
    from decoding.models.specs import parse_model_spec

    problems = []
    for candidate in _tokenizer_candidates(spec):
        try:
            parsed = parse_model_spec(candidate)
            if parsed.kind == "preset" and not pack.is_pulled(parsed.preset):
                problems.append(f"{candidate}: not pulled (`draftwise models pull {candidate}`)")
                continue
            if parsed.kind == "hub":
                from huggingface_hub import snapshot_download

                source = snapshot_download(candidate, local_files_only=True, allow_patterns=["*.json", "*.txt", "*.model"])
            else:
                source, _ = model_source(parsed)
            return AutoTokenizer.from_pretrained(source), candidate
        except Exception as exc:  # noqa: BLE001 - try the next candidate, say why at the end
            problems.append(f"{candidate}: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}")
    raise ModelNotAvailable(
        f"no tokenizer for the remote model '{spec.model}' ({'; '.join(problems)}): add "
        f"?tokenizer=SPEC to the target (a preset, a model directory or a cached hub id of the same family)")


class _CutOff(Exception):
    """The stream ended without the finish reason every answer ends with."""


@dataclass
class _Streamed:
    """What one answer's stream has brought so far."""

    started: float  # time.perf_counter() when the request started
    soft_deadline: float | None = None  # the request's time cap (time.perf_counter()); see past_cap
    whole_lines: bool = True  # past the cap: end at the next line end (False, the "full" scope: at once)
    text: str = ""
    keep: int | None = None  # where a stop rule cut the text
    chunks: int = 0

    def past_cap(self) -> bool:
        """Past the time cap with something to show: for whole lines, the text is cut to its last
        whole line; otherwise wait for one."""
        if self.soft_deadline is None or time.perf_counter() < self.soft_deadline:
            return False
        kept = kept_past_time_cap(self.text, self.whole_lines)
        if kept is None:
            return False
        self.text = kept
        return True

    def final_text(self, stopped: str, final_rule) -> str:
        if stopped == "error":
            return ""
        if stopped == "stop_rule":
            return self.text[:self.keep]
        if stopped == "cancelled":
            return self.text
        cut = final_rule(self.text.rstrip("\ufffd"))
        return self.text if cut is None else self.text[:cut]


class RemoteEngine:
    """The remote engine: decoding.api.CompletionEngine over an inference server's HTTP API."""

    def __init__(self, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        self.spec = parse_remote_target(self.config.target)
        self.state = "idle"
        self.error: str | None = None
        self.on_health: Callable[[str, str], None] | None = None  # (level "error"|"info", sentence)
        self.health = "unknown"  # OK, or one of backends' problem kinds
        self.problem: str | None = None
        self.served_models: list[str] | None = None
        self.tokenizer = None
        self.tokenizer_source: str | None = None
        self.prompts = None
        self._backend = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.jobs = JobRegistry()
        self._lock = threading.Lock()
        self._cumulative = RequestStats(drafter="remote")
        self._last: RemoteRequestStats | None = None
        self._requests = 0
        self._closed = False
        self._api_key: str | None = None
        # The server's own speculation, as its /metrics count it: the counters at the last reading and
        # the draft/accepted tokens they grew by while draftwise's requests ran (None: no such counters).
        self._spec_counters: dict[str, float] | None = None
        self.speculation: dict[str, float] | None = None

    # ---- the event loop thread -------------------------------------------------------------------
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            self._thread = threading.Thread(target=run, name="draftwise-remote", daemon=True)
            self._thread.start()
            ready.wait()
            self._loop = loop
        return self._loop

    def _call(self, coroutine) -> concurrent.futures.Future:
        if self._closed:
            coroutine.close()
            raise DraftwiseError("the engine is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._ensure_loop())

    # ---- loading ---------------------------------------------------------------------------------
    def start_loading(self, progress: Progress | None = None) -> concurrent.futures.Future:
        self.state, self.error = "loading", None
        return self._call(self._load(progress or (lambda message, fraction: None)))

    def load(self, progress: Progress | None = None) -> None:
        self.start_loading(progress).result()

    async def _load(self, progress: Progress) -> None:
        try:
            key = self._api_key = api_key_from_env(self.spec.api_key_env)
            if self.spec.api == "openai":
                progress(f"loading the tokenizer for {self.spec.model}", 0.1)
                self.tokenizer, self.tokenizer_source = await asyncio.to_thread(load_tokenizer, self.spec)
                from decoding.prompt import PromptBuilder

                # a remote model is not measured by the quality gate: auto keeps the rest of the line
                self.prompts = PromptBuilder(self.tokenizer, self.config.context_tokens,
                                             whole_suffix=self.config.suffix == "lines")
                if not self.prompts.template.is_fim:
                    log.warning("the tokenizer of %s has no fill-in-the-middle tokens: prompts are the prefix only",
                                self.spec.model)
            self._backend = backends.make_backend(self.spec, key)
            progress(f"contacting {self.spec.display}", 0.6)
            # Not reachable now is not a failed load: the server may start later; requests retry.
            await self._check_server()
            self._spec_counters = await backends.speculation_counters(self.spec, key)
            if self._spec_counters is not None:
                self.speculation = {"drafted": 0, "accepted": 0}
            log.info("remote engine ready: %s (tokenizer %s, API key %s, health %s)", self.spec.display,
                     self.tokenizer_source or "the server's", "set" if key else "not set", self.health)
            progress("ready", 1.0)
        except DraftwiseError as exc:
            self.state, self.error = "failed", str(exc)
            raise
        except Exception as exc:  # noqa: BLE001 - one clear line, as the local engine does
            self.state, self.error = "failed", f"loading failed: {type(exc).__name__}: {exc}".splitlines()[0]
            raise ModelSpecError(self.error) from exc
        self.state = "ready"

    async def _check_server(self) -> bool:
        """Ask the server what it serves; records health. True when it can serve our model."""
        try:
            served = await self._backend.models()
        except backends.RemoteProblem as problem:
            self._set_health(problem.kind, str(problem))
            return False
        self.served_models = served
        if self.spec.model and served and self.spec.model not in served:
            self._set_health(backends.WRONG_MODEL,
                             f"the inference server at {self.spec.url} serves {', '.join(served)}, "
                             f"not '{self.spec.model}': fix the model name after # in the target")
            return False
        self._set_health(OK, None)
        return True

    def _set_health(self, health: str, problem: str | None) -> None:
        before, before_problem = self.health, self.problem
        self.health, self.problem = health, problem
        if health == OK:
            if before not in (OK, "unknown"):
                log.info("the inference server at %s is back", self.spec.url)
                self._notify("info", f"the inference server at {self.spec.url} is back; completions resume")
            return
        if (health, problem) != (before, before_problem):
            log.warning("remote engine: %s", problem)
            self._notify("error", f"{problem}. Completions resume when it is fixed; draftwise keeps running.")

    def _notify(self, level: str, message: str) -> None:
        callback = self.on_health
        if callback is not None:
            try:
                callback(level, message)
            except Exception:  # noqa: BLE001 - a listener must not break requests
                log.debug("health listener failed", exc_info=True)

    # ---- requests --------------------------------------------------------------------------------
    def _require_ready(self) -> None:
        if self.state != "ready":
            why = f": {self.error}" if self.error else ""
            raise EngineNotReady(f"the remote engine is not ready (state {self.state}{why})")

    def build_prompt(self, request: CompletionRequest) -> list[int]:
        """The FIM prompt's token ids (openai); /infill leaves the prompt to the server."""
        self._require_ready()
        if self.prompts is None:
            raise DraftwiseError("llama.cpp's /infill builds its prompt on the server")
        return self.prompts.build_request(request).ids  # blanks kept: the server writes what follows them

    def submit(self, request: CompletionRequest, cancel: CancelToken | None = None, version: int = 0,
               idle: bool = False) -> RemoteJob:
        """version: the document version the request was made for (see document_changed). idle: a
        prefetch nobody waits for; a remote engine keeps no cache to warm, so it ends at once."""
        self._require_ready()
        check_request(request)
        job = RemoteJob(request, cancel, version, idle)
        if idle:
            job.cancel_token.cancel()
            job.future.set_result(CompletionResult("", RemoteRequestStats(drafter="remote", stopped="cancelled")))
            return job
        self.jobs.add(job)  # latest wins: the previous job's stream closes now
        loop = self._ensure_loop()

        def start() -> None:
            job._loop = loop
            job._task = loop.create_task(self._run(job))
            job._task.add_done_callback(lambda task: self._settle(job, task))
            if job.cancel_token.cancelled:
                job._task.cancel()

        loop.call_soon_threadsafe(start)
        return job

    def prepare(self, request: CompletionRequest) -> None:
        """Idle work: nothing to read ahead here (the server keeps its own prompt cache)."""
        return None

    def complete(self, request: CompletionRequest, cancel: CancelToken | None = None) -> CompletionResult:
        return self.submit(request, cancel).result()

    def _settle(self, job: RemoteJob, task: asyncio.Task) -> None:
        self.jobs.done(job)
        if job.future.done():
            return
        if task.cancelled():  # cancelled before it started
            stats = RemoteRequestStats(drafter="remote", stopped="cancelled")
            job.future.set_result(self._record(CompletionResult("", stats)))
        elif task.exception() is not None:
            job.future.set_exception(task.exception())
        else:
            job.future.set_result(task.result())

    def _wire_request(self, req: CompletionRequest, stats: RemoteRequestStats, max_tokens: int) -> dict:
        common = {"max_tokens": max_tokens, "temperature": req.temperature, "top_p": req.top_p,
                  "top_k": req.top_k, "seed": req.seed}
        budget = req.context_tokens or self.config.context_tokens
        if self.prompts is not None:
            ids = self.build_prompt(req)
            stats.prompt_tokens = len(ids)
            text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            template = self.prompts.template
            return {**common, "prompt": text, "stop": [t for t in template.end_tokens if t != template.middle][:4]}
        chars = budget * CHARS_PER_TOKEN
        prefix = valid_text(req.prefix)[-chars:]
        room = max(0, chars - len(prefix))
        extra = []
        for f in req.context:
            if len(f.text) <= room:
                extra.append({"filename": f.path, "text": valid_text(f.text)})
                room -= len(f.text)
        return {**common, "prefix": prefix, "suffix": valid_text(req.suffix)[:SUFFIX_CHARS], "extra": extra, "stop": []}

    async def _run(self, job: RemoteJob) -> CompletionResult:
        req = job.request
        stats = RemoteRequestStats(drafter="remote")
        if job.cancel_token.cancelled:
            stats.stopped = "cancelled"
            return self._record(CompletionResult("", stats))
        text_rule, final_rule = completion_rules(req.prefix, req.suffix, req.language, req.path, req.scope)
        # The request's time cap is soft (as in the local engine: past it the answer ends at its next
        # line end, never empty); the spec's timeout is the hard deadline.
        deadline_s = self.spec.timeout_s
        timer = asyncio.get_running_loop().call_later(deadline_s, self._deadline, job)
        started = time.perf_counter()
        streamed = _Streamed(started=started, whole_lines=req.scope != "full",
                             soft_deadline=started + req.time_limit_s if req.time_limit_s else None)
        try:
            await self._answer(job, stats, text_rule, streamed, deadline_s)
        finally:
            timer.cancel()
        elapsed = (time.perf_counter() - streamed.started) * 1000
        stats.prefill_ms = stats.first_token_ms if streamed.chunks else elapsed
        stats.decode_ms = max(0.0, elapsed - stats.prefill_ms)
        completion = stats.server.get("completion_tokens") or stats.server.get("tokens_predicted")
        stats.generated_tokens = (completion if completion and stats.stopped in ("eos", "max_tokens")
                                  else streamed.chunks)
        stats.target_forwards = streamed.chunks
        if not stats.prompt_tokens:
            stats.prompt_tokens = stats.server.get("prompt_tokens") or stats.server.get("tokens_evaluated") or 0
        log.debug("request ended: %s after %d chunks, %.0f ms", stats.stopped, streamed.chunks, elapsed)
        if self._spec_counters is not None:  # after the answer: the reading never delays it
            asyncio.get_running_loop().create_task(self._read_speculation())
        return self._record(CompletionResult(streamed.final_text(stats.stopped, final_rule), stats))

    def server_counters_now(self, names: dict[str, str]) -> dict[str, float] | None:
        """The named samples of the server's /metrics now (None without one): a benchmark, the
        server's only client, reads them around each request it times."""
        return self._call(backends.server_counters(self.spec, self._api_key, names)).result(timeout=10)

    async def _read_speculation(self) -> None:
        """Add what the server's speculation counters grew by since the last reading. The server counts
        every client's requests; with draftwise its only client, that is draftwise's."""
        now = await backends.speculation_counters(self.spec, self._api_key)
        if now is None or self._spec_counters is None:
            return
        with self._lock:
            before, self._spec_counters = self._spec_counters, now
            for key in ("drafted", "accepted"):
                grew = now[key] - before[key]
                if grew >= 0:  # a restarted server starts its counters again
                    self.speculation[key] += int(grew)

    async def _answer(self, job: RemoteJob, stats: RemoteRequestStats, text_rule, streamed: "_Streamed",
                      deadline_s: float) -> None:
        """Stream the answer into `streamed`; a failure becomes stopped="error" and the server's health."""
        try:
            if self.health != OK and not await self._check_server():
                raise backends.RemoteProblem(self.health, self.problem or "the inference server is not usable")
            await self._stream(self._wire_request(job.request, stats, job.request.max_tokens or self.config.max_tokens),
                               stats, text_rule, streamed)
            self._set_health(OK, None)
        except asyncio.CancelledError:
            if not job.cancel_token.cancelled and job.reason != "time_limit":
                raise  # the loop itself is going away
            stats.stopped = job.reason
            if job.reason == "time_limit" and streamed.chunks == 0:
                self._set_health(backends.SLOW, f"the inference server at {self.spec.url} sent nothing "
                                                f"within {deadline_s:g} s")
                stats.stopped, stats.error = "error", self.problem or ""
            elif job.reason == "time_limit":
                self._set_health(OK, None)
        except (_CutOff, backends.RemoteProblem) as problem:
            if job.cancel_token.cancelled:  # the cancel closed the stream before it reached this task
                stats.stopped = job.reason or "cancelled"
                return
            if isinstance(problem, _CutOff):
                # A clean end (a dead server breaks the connection instead, a transport error): the
                # server ended this answer itself, as llama-cpp-python's does when another request
                # arrives (draftwise's own, for another document). Not a problem to report: were it going
                # away, the next request finds out. (Asking it now would take its lock, and that server
                # interrupts the newer one.)
                stats.stopped = "error"
                stats.error = (f"the inference server at {self.spec.url} ended the answer without a finish "
                               "reason (another request may have interrupted it)")
                log.info("request cut off: %s", stats.error)
                return
            self._set_health(problem.kind, str(problem))
            stats.stopped, stats.error = "error", str(problem)
        except Exception as exc:  # noqa: BLE001 - an unexpected reply: one line, the server keeps going
            log.debug("remote request failed", exc_info=True)
            problem = f"the inference server at {self.spec.url} sent something unexpected: {type(exc).__name__}: {exc}"
            self._set_health(backends.FAILING, problem.splitlines()[0])
            stats.stopped, stats.error = "error", self.problem or ""

    async def _stream(self, wire: dict, stats: RemoteRequestStats, text_rule, streamed: "_Streamed") -> None:
        """Read the server's stream; a stop rule that fires closes it, which stops the server."""
        async with self._backend.stream(**wire) as stream, contextlib.aclosing(stream):
            async for chunk in stream:
                if chunk.usage:
                    stats.server.update({k: v for k, v in chunk.usage.items() if v is not None})
                if chunk.text:
                    streamed.chunks += 1
                    if streamed.chunks == 1:
                        stats.first_token_ms = (time.perf_counter() - streamed.started) * 1000
                    streamed.text += chunk.text
                    streamed.keep = text_rule(streamed.text.rstrip("\ufffd"))
                    if streamed.keep is not None:
                        stats.stopped = "stop_rule"
                        return  # leaving the block closes the stream: the server stops
                    if streamed.past_cap():
                        stats.stopped = "time_limit"
                        return
                if chunk.finish_reason:
                    stats.stopped = "max_tokens" if chunk.finish_reason == "length" else "eos"
        if not stats.stopped:  # servers end every answer with a finish reason; this one was cut off
            raise _CutOff()

    def _deadline(self, job: RemoteJob) -> None:
        if job._task is not None and not job._task.done():
            job.reason = "time_limit"
            job._task.cancel()

    def clear_caches(self) -> None:
        """Nothing kept here; the server's prompt cache is its own."""

    def _record(self, result: CompletionResult) -> CompletionResult:
        with self._lock:
            self._requests += 1
            self._last = result.stats
            self._cumulative.add(result.stats)  # the RequestStats fields; `server` and `error` stay per request
        return result

    # ---- reporting -------------------------------------------------------------------------------
    def remote_status(self) -> dict:
        return {"api": self.spec.api, "url": self.spec.url, "model": self.spec.model or None,
                "health": self.health, "problem": self.problem, "servedModels": self.served_models,
                "timeoutS": self.spec.timeout_s, "apiKeyEnv": self.spec.api_key_env,
                "speculation": self._speculation_report()}

    def _speculation_report(self) -> dict | None:
        """The server's own speculative decoding over draftwise's requests (None: it reports none)."""
        if self.speculation is None:
            return None
        drafted, accepted = self.speculation["drafted"], self.speculation["accepted"]
        return {"drafted": drafted, "accepted": accepted,
                "acceptance": round(accepted / drafted, 3) if drafted else None}

    def _suffix(self) -> dict | None:
        """What the prompt shows after the cursor (EngineConfig.suffix; a remote model is not measured)."""
        if self.prompts is not None:
            if not self.prompts.template.is_fim:
                return {"lines": False, "why": "no fill-in-the-middle tokens: the prompt is the prefix only"}
            lines = self.prompts.whole_suffix
            return {"lines": lines, "why": "the lines after the cursor, as asked" if lines else
                    f"the rest of the cursor's line (suffix: {self.config.suffix}; a remote model is not measured)"}
        if self.spec.api != "openai":
            return {"lines": True, "why": f"the inference server's /infill reads up to {SUFFIX_CHARS} characters "
                                          "after the cursor, whatever the suffix setting"}
        return None

    def info(self) -> dict:
        return {
            "state": self.state, "error": self.error, "target": self.spec.display,
            "target_name": self.spec.model or self.spec.url, "draft": None, "draft_loaded": False,
            "draft_note": "drafting, if any, happens on the inference server", "drafter": "remote",
            "device": f"remote ({self.spec.api})", "dtype": None, "weights": "remote",
            "weights_reason": "the inference server's", "weights_choice": None, "draft_weights": None,
            "fim_template": (self.prompts.template.family if self.prompts else "llama.cpp /infill"),
            "suffix": self._suffix(),
            "tokenizer": self.tokenizer_source, "cost_model": None, "remote": self.remote_status(),
        }

    def stats(self) -> dict:
        with self._lock:
            cumulative = self._cumulative.copy()
            last = self._last
            n = self._requests
        return {"requests": n, "cumulative": cumulative.to_dict(), "last": last.to_dict() if last else None,
                "remote": self.remote_status()}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.jobs.cancel_all()
        loop = self._loop
        if loop is None:
            return
        if self._backend is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._backend.close(), loop).result(timeout=5)
            except Exception:  # noqa: BLE001 - closing sockets at shutdown is best effort
                log.debug("closing the HTTP client failed", exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)

