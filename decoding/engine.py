"""The engine: loads the models onto one worker thread and runs each submitted request there.

What a request does is in decoding/request.py, what is loaded in decoding/setup/;
this class ties them to a thread, a per-document job registry and the stats."""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import statistics
import threading

from decoding import alternatives
from decoding.api import DRAFTERS, CancelToken, CompletionRequest, CompletionResult, EngineConfig, RequestStats
from decoding.errors import DraftwiseError, EngineNotReady, ModelLoadError, ModelSpecError, check_request
from decoding.jobs import Job, JobRegistry, ModelWorker
from decoding.setup import LoadedModels, Progress, load_models
from decoding.request import plan_request, read_prompt_ahead, run_request

log = logging.getLogger("draftwise.engine")

__all__ = ["Engine", "Job", "Progress"]


class Engine:
    def __init__(self, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        if self.config.drafter not in DRAFTERS:
            raise ModelSpecError(f"unknown drafter '{self.config.drafter}': use one of {', '.join(DRAFTERS)}")
        self.state = "idle"
        self.error: str | None = None
        self.models: LoadedModels | None = None
        self.jobs = JobRegistry()
        self._worker = ModelWorker()
        self._lock = threading.Lock()  # guards the stats below
        self._cumulative = RequestStats(drafter=self.config.drafter)
        self._last: RequestStats | None = None
        self._requests = 0
        # Idle work (prepare, and submit(idle=True)): counted apart from the requests users wait for.
        # joined: idle jobs a request then waited for instead of starting over.
        self._idle = {"prepared_tokens": 0, "read_aheads": 0, "prefetches": 0, "cancelled": 0, "joined": 0,
                      "prefetch_read_tokens": 0}
        # Prompt tokens each request read (not found in the KV cache): what a keystroke costs before its
        # first new token; the last ones, for a median.
        self._read_per_request: collections.deque[int] = collections.deque(maxlen=4096)
        self._running: Job | None = None  # the job on the worker thread now

    # ---- loading ------------------------------------------------------------------------------
    def start_loading(self, progress: Progress | None = None) -> concurrent.futures.Future:
        self.state, self.error = "loading", None
        return self._worker.call(lambda: self._load(progress or (lambda msg, frac: None)))

    def load(self, progress: Progress | None = None) -> None:
        self.start_loading(progress).result()

    def _load(self, progress: Progress) -> None:
        try:
            self.models = load_models(self.config, progress)
        except DraftwiseError as exc:
            self.state, self.error = "failed", str(exc)
            raise
        except Exception as exc:  # anything else from torch/transformers: keep it one clear line
            self.state, self.error = "failed", f"loading failed: {type(exc).__name__}: {exc}".splitlines()[0]
            raise ModelLoadError(self.error) from exc
        self.state = "ready"
        m = self.models
        log.info("engine ready: target=%s draft=%s device=%s weights=%s (%s) cost=%s", m.target.name,
                 m.draft.name if m.draft else None, m.target.device, m.target.weights, m.weights.reason,
                 m.cost.summary())

    def on_model_thread(self, fn):
        """Run fn on the thread that runs the engine's forwards and return its result (torch work
        outside the engines, e.g. the benchmark's transformers baselines, belongs there too)."""
        return self._worker.call(fn).result()

    # ---- requests -----------------------------------------------------------------------------
    def build_prompt(self, request: CompletionRequest) -> list[int]:
        return self._ready_models().build_prompt(request)

    def clear_caches(self) -> None:
        """Forget every stored KV cache (benchmarks measure cold requests with it)."""
        models = self._ready_models()
        self._worker.call(models.clear_caches).result()

    def _ready_models(self) -> LoadedModels:
        if self.state != "ready" or self.models is None:
            why = f": {self.error}" if self.error else ""
            raise EngineNotReady(f"the model is not ready (state {self.state}{why})")
        return self.models

    def submit(self, request: CompletionRequest, cancel: CancelToken | None = None, version: int = 0,
               idle: bool = False) -> Job:
        """Queue a request; it cancels its document's previous job (latest wins, even inside the verify
        loop). version: the document version it was made for (see document_changed). idle: nobody
        waits for it (a prefetch): any request that is not idle cancels it."""
        self._ready_models()
        check_request(request)
        if cancel is None:
            # The same request as idle work already started (a prefetch, then the edit that accepts
            # it): keep that job rather than starting over.
            same = self.jobs.idle_for(request) if idle else self._join_idle(request, version)
            if same is not None:
                return same
        return self._queue(Job(request, cancel, version, idle), self._run)

    def _join_idle(self, request: CompletionRequest, version: int) -> Job | None:
        """An idle job computing exactly this request (a suggestion started when the user paused, or
        a prefetch): the user now waits for it. It goes on, or has its answer already, instead of
        being cancelled and started over."""
        with self._lock:  # _record reads job.idle under it: the job counts once as a request
            job = self.jobs.claim_idle(request, version)
            if job is None:
                return None
            self._idle["joined"] += 1
            if job.recorded is not None:  # it ended before the user asked: count it as a request now
                self._count_request(job.recorded)
        log.info("request: joined idle work for the same prompt (%s)",
                 "its answer was ready" if job.recorded is not None else "still running")
        return job

    def prepare(self, request: CompletionRequest) -> Job:
        """Idle work: read the prompt this request would have into the KV caches, so that the same
        request, when the user asks, starts from them. Any request that is not idle cancels it
        within one prefill chunk. The job's result is the number of prompt tokens read."""
        self._ready_models()
        return self._queue(Job(request, idle=True, prompt_only=True), self._read_ahead)

    def _queue(self, job: Job, run) -> Job:
        self.jobs.add(job)
        inner = self._worker.call(lambda: self._on_worker(job, run))
        inner.add_done_callback(lambda f: self._settle(job, f))
        return job

    def _on_worker(self, job: Job, run):
        self._running = job
        try:
            return run(job)
        finally:
            self._running = None

    def complete(self, request: CompletionRequest, cancel: CancelToken | None = None) -> CompletionResult:
        return self.submit(request, cancel).result()

    def _settle(self, job: Job, inner: concurrent.futures.Future) -> None:
        self.jobs.done(job)
        if job.future.done():  # a caller cancelled the future itself; nobody waits for the result
            return
        if inner.exception() is not None:
            job.future.set_exception(inner.exception())
        else:
            job.future.set_result(inner.result())

    def _run(self, job: Job) -> CompletionResult:
        """On the worker thread: plan the request, run it, then its alternatives (if asked for)."""
        request, cancel, models = job.request, job.cancel_token, self._ready_models()
        if cancel.cancelled:  # cancelled while queued: no model time spent
            stats = RequestStats(drafter=request.drafter or self.config.drafter, stopped="cancelled")
            return self._record(CompletionResult("", stats), job)
        if (request.drafter or self.config.drafter) == "model":
            models.ensure_draft_model(self.config)  # asked for by name: load it if `auto` left it out
        plan = plan_request(models, self.config, request, seen=job.saw)
        result, stop = run_request(models, plan, cancel)
        if request.alternatives and stop.reason != "cancelled":
            result.alternatives = alternatives.generate(models, plan, result.text, cancel)
        return self._record(result, job)

    def _read_ahead(self, job: Job) -> int:
        read = 0 if job.cancel_token.cancelled else read_prompt_ahead(self._ready_models(), job.request,
                                                                      job.cancel_token)
        with self._lock:
            self._idle["prepared_tokens"] += read
            self._idle["read_aheads"] += 1
            self._idle["cancelled"] += job.cancel_token.cancelled
        return read

    def _record(self, result: CompletionResult, job: Job) -> CompletionResult:
        s = result.stats
        with self._lock:
            job.recorded, idle = s, job.idle
            read = max(0, s.prompt_tokens - s.reused_prompt_tokens)
            if idle:
                self._idle["prefetches"] += 1
                self._idle["cancelled"] += s.stopped == "cancelled"
                self._idle["prefetch_read_tokens"] += read
            else:
                self._count_request(s)
                if s.prompt_tokens:  # a request cancelled while queued read nothing and counts for nothing
                    self._read_per_request.append(read)
        # Where a request's time went, one line each (cancelled ones only in debug logs: one a keystroke).
        log.log(logging.DEBUG if idle or s.stopped == "cancelled" else logging.INFO,
                "%s: prompt %d tokens (%d reused), prefill %.0f ms, first token %.0f ms, %d tokens in %.0f ms, "
                "stopped: %s", "idle" if idle else "request", s.prompt_tokens, s.reused_prompt_tokens,
                s.prefill_ms, s.first_token_ms, s.generated_tokens, s.decode_ms, s.stopped)
        return result

    def _count_request(self, stats: RequestStats) -> None:
        """Under self._lock: one request a user waited for."""
        self._requests += 1
        self._last = stats
        self._cumulative.add(stats)

    # ---- reporting ----------------------------------------------------------------------------
    def info(self) -> dict:
        m = self.models
        t = m.target if m else None
        return {
            "state": self.state, "error": self.error, "target": self.target,
            "target_choice": m.target_choice.reason if m and m.target_choice else None,
            "target_name": t.name if t else None, "draft": self.config.draft,
            "draft_loaded": bool(m and m.draft), "draft_note": m.draft_note if m else "",
            "drafting_off": m.drafting_off if m else "",
            "drafter": self.config.drafter, "device": str(t.device) if t else self.config.device,
            "dtype": str(t.dtype).replace("torch.", "") if t else self.config.dtype,
            "weights": t.weights if t else None,
            "weights_reason": m.weights.reason if m else None,
            "weights_choice": m.weights.to_dict() if m else None,
            "draft_weights": m.draft.weights if m and m.draft else None,
            "kernel": m.kernel if m else None,
            # drafts are verified bit for bit (the exactness probe's widest exact width), or not at all
            "verify": ({"exact_width": m.target_runner.exact_width, "lossless": m.target_runner.verify_exact,
                        "exact": getattr(m.target_runner, "exact_how", None)} if m else None),
            "fim_template": m.prompts.template.family if m else None,
            "suffix": {"lines": m.prompts.whole_suffix, "why": m.suffix_why} if m else None,
            "repo_context": self._repo_context() if m else None,
            "cost_model": {**m.cost.summary(), **m.draft_costs} if m else None,
        }

    @property
    def target(self) -> str:
        """The target model spec: the one `auto` chose once loaded."""
        m = self.models
        return m.target_choice.spec if m is not None and m.target_choice is not None else self.config.target

    def _repo_context(self) -> dict:
        """Whether the repository as context pays for this target (`repoContext: "auto"`)."""
        from decoding.models.quality_gate import repo_context_verdict
        from decoding.models.specs import model_key, parse_model_spec

        pays, why = repo_context_verdict(model_key(parse_model_spec(self.target)))
        return {"pays": pays, "why": why}

    def stats(self) -> dict:
        with self._lock:
            cumulative, last, n, idle = self._cumulative.copy(), self._last, self._requests, dict(self._idle)
            reads = list(self._read_per_request)
        job = self._running
        # what the worker computes now: a client (or a test) can wait on it instead of guessing times
        running = None if job is None else {"document": job.request.document, "idle": job.idle,
                                            "prompt_only": job.prompt_only, "chars": len(job.text_so_far)}
        prompt_read = {"requests": len(reads), "median": statistics.median(reads) if reads else None,
                       "mean": round(statistics.fmean(reads), 1) if reads else None}
        return {"requests": n, "cumulative": cumulative.to_dict(), "last": last.to_dict() if last else None,
                "idle": idle, "running": running, "prompt_read": prompt_read}

    def close(self) -> None:
        self.jobs.cancel_all()
        self._worker.close()
