"""The engine: owns the models, a worker thread that runs them, and everything a request needs."""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import threading
import time
from dataclasses import fields, replace
from typing import Callable

from decoding.api import DRAFTERS, SCOPES, CancelToken, CompletionRequest, CompletionResult, EngineConfig, RequestStats
from decoding import faults
from decoding.errors import DraftwiseError, EngineNotReady, ModelLoadError, ModelSpecError

log = logging.getLogger("draftwise.engine")

Progress = Callable[[str, "float | None"], None]


def _valid_text(text: str) -> str:
    """Editors can send lone UTF-16 surrogates; tokenizers reject them. Replace them, keep the rest."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


class Job:
    """One submitted request: cancel it from any thread, await it from asyncio."""

    def __init__(self, request: CompletionRequest, cancel: CancelToken | None = None):
        self.request = request
        self.cancel_token = cancel or CancelToken()
        self.future: concurrent.futures.Future = concurrent.futures.Future()

    def cancel(self) -> None:
        self.cancel_token.cancel()

    def result(self, timeout: float | None = None) -> CompletionResult:
        return self.future.result(timeout)

    def __await__(self):
        # Shielded: cancelling the awaiting task must not cancel the engine's future (call cancel()
        # to stop the generation; the job then resolves with stopped="cancelled").
        return asyncio.shield(asyncio.wrap_future(self.future)).__await__()


def _available_memory_bytes(device) -> int | None:
    try:
        if device.type == "cuda":
            import torch

            free, _ = torch.cuda.mem_get_info(device)
            return free
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, RuntimeError, ValueError):
        pass
    return None


class Engine:
    def __init__(self, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        if self.config.drafter not in DRAFTERS:
            raise ModelSpecError(f"unknown drafter '{self.config.drafter}': use one of {', '.join(DRAFTERS)}")
        self.state = "idle"
        self.error: str | None = None
        self.target = None  # LoadedModel
        self.draft = None  # LoadedModel, when a draft model is loaded
        self.draft_note = ""  # why the draft model is (not) used
        self.weights = None  # WeightsChoice of the target
        self.draft_weights = None  # WeightsChoice of the draft model
        self.cost = None
        self.prompts = None  # PromptBuilder, once the tokenizer is loaded
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._jobs: dict[str, Job] = {}  # latest job per document
        self._lock = threading.Lock()
        self._cumulative = RequestStats(drafter=self.config.drafter)
        self._last: RequestStats | None = None
        self._requests = 0
        self._closed = False

    # ---- worker thread ------------------------------------------------------------------------
    def _ensure_worker(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="draftwise-engine", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        import torch

        with torch.inference_mode():
            while True:
                task = self._queue.get()
                if task is None:
                    return
                fn, future = task
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                    future.set_exception(exc)

    def _call(self, fn) -> concurrent.futures.Future:
        if self._closed:
            raise DraftwiseError("the engine is closed")
        self._ensure_worker()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((fn, future))
        return future

    # ---- loading ------------------------------------------------------------------------------
    def start_loading(self, progress: Progress | None = None) -> concurrent.futures.Future:
        self.state = "loading"
        self.error = None
        return self._call(lambda: self._load(progress or (lambda msg, frac: None)))

    def load(self, progress: Progress | None = None) -> None:
        self.start_loading(progress).result()

    def _load(self, progress: Progress) -> None:
        try:
            self._load_models(progress)
        except DraftwiseError as exc:
            self.state, self.error = "failed", str(exc)
            raise
        except Exception as exc:  # anything else from torch/transformers: keep it one clear line
            self.state, self.error = "failed", f"loading failed: {type(exc).__name__}: {exc}".splitlines()[0]
            raise ModelLoadError(self.error) from exc
        self.state = "ready"

    def _load_models(self, progress: Progress) -> None:
        from transformers.utils import logging as hf_logging

        from decoding.cost_model import CostModel, measure_forward_times
        from decoding.drafters.draft_model import ModelDrafter
        from decoding.drafters.lookup import LookupDrafter
        from decoding.drafters.suggestion import SuggestionDrafter, SuggestionMemory
        from decoding.models.weight_choice import load_weights
        from decoding.prompt import PromptBuilder, end_token_ids
        from decoding.runner import ModelRunner

        hf_logging.disable_progress_bar()
        cfg = self.config
        budget = cfg.cache_mb * 1024 * 1024
        progress(f"loading target {cfg.target}", 0.05)
        self.target, self.weights = load_weights(cfg.target, cfg.weights, cfg.device, cfg.dtype,
                                                 cfg.trust_remote_code, "target")
        self.tokenizer = self.target.tokenizer
        self.prompts = PromptBuilder(self.tokenizer, cfg.context_tokens)
        self.end_ids = end_token_ids(self.tokenizer, self.prompts.template)
        self.target_runner = ModelRunner(self.target, budget)
        progress("measuring forward costs on this device", 0.5)
        self.cost = CostModel(measure_forward_times(self.target_runner, repeats=3 if cfg.measure_cost else 1))
        self.memory = SuggestionMemory()
        self.drafters = {"lookup": LookupDrafter(), "suggestion": SuggestionDrafter(self.memory, self.tokenizer)}
        if cfg.draft and cfg.draft != "none":
            progress(f"loading draft {cfg.draft}", 0.6)
            self._load_draft(load_weights, ModelRunner, ModelDrafter, measure_forward_times, budget)
        progress("ready", 1.0)
        log.info("engine ready: target=%s draft=%s device=%s weights=%s (%s) cost=%s", self.target.name,
                 self.draft.name if self.draft else None, self.target.device, self.target.weights,
                 self.weights.reason, self.cost.summary())

    def _load_draft(self, load_weights, ModelRunner, ModelDrafter, measure_forward_times, budget) -> None:
        cfg = self.config
        try:
            from decoding.models.specs import parse_model_spec

            spec = parse_model_spec(cfg.draft)
            free = _available_memory_bytes(self.target.device)
            need = self._estimate_bytes(cfg.draft)
            if free is not None and need is not None and need * 1.2 > free:
                self.draft_note = f"not loaded: needs ~{need >> 20} MiB, {free >> 20} MiB free"
                log.warning("draft model %s %s", spec.value, self.draft_note)
                return
            draft, self.draft_weights = load_weights(cfg.draft, cfg.draft_weights, cfg.device, cfg.dtype,
                                                     cfg.trust_remote_code, "draft")
            if draft.tokenizer.get_vocab() != self.tokenizer.get_vocab():
                self.draft_note = "not used: its tokenizer differs from the target's"
                log.warning("draft model %s %s", cfg.draft, self.draft_note)
                return
            runner = ModelRunner(draft, budget // 2, role="draft")
            self.cost.draft_step_s = measure_forward_times(runner, sizes=(1, 2), repeats=3).by_tokens[1]
            prefill = measure_forward_times(runner, sizes=(64, 128), repeats=1)
            self.cost.draft_prefill_s = prefill(128) / 128
            pays = self.cost.model_pays()
            if not pays and cfg.drafter == "auto":
                self.draft_note = (f"unloaded: a draft step costs {self.cost.draft_step_s / self.cost.t(1):.2f} "
                                   "target steps, too much to pay even at 90% acceptance")
                log.info("draft model %s %s", cfg.draft, self.draft_note)
                return
            self.draft = draft
            ratio = self.cost.draft_step_s / self.cost.t(1)
            self.draft_note = (
                f"pays per step (a drafted token costs {ratio:.2f} target steps); `auto` uses it only when "
                f"that also pays for reading the prompt first ({self.cost.draft_prefill_s * 1000:.1f} ms a token)"
                if pays else "kept because --drafter model asks for it; it does not pay here")
            self.drafters["model"] = ModelDrafter(runner)
        except DraftwiseError as exc:
            # The target alone still serves completions; say why the draft is missing.
            self.draft_note = f"failed to load: {exc}"
            log.warning("draft model %s", self.draft_note)

    @staticmethod
    def _estimate_bytes(spec_text: str) -> int | None:
        from pathlib import Path

        from decoding.models import pack
        from decoding.models.specs import parse_model_spec

        spec = parse_model_spec(spec_text)
        root = pack.preset_dir(spec.preset) if spec.preset else Path(spec.value) if spec.kind == "hf_dir" else None
        if root is None or not root.exists():
            return None
        return sum(f.stat().st_size for f in root.glob("*.safetensors"))

    # ---- requests -----------------------------------------------------------------------------
    def build_prompt(self, request: CompletionRequest) -> list[int]:
        self._require_ready()
        context = [replace(f, text=_valid_text(f.text)) for f in request.context]
        return self.prompts.build(_valid_text(request.prefix), _valid_text(request.suffix), request.path, context,
                                  budget=request.context_tokens).ids

    def clear_caches(self) -> None:
        """Forget every stored KV cache and suggestion (benchmarks measure cold requests with it)."""
        self._require_ready()

        def clear():
            self.target_runner.store.clear()
            if "model" in self.drafters:
                self.drafters["model"].runner.store.clear()
            self.memory = type(self.memory)()
            self.drafters["suggestion"].memory = self.memory

        self._call(clear).result()

    def _require_ready(self) -> None:
        if self.state != "ready":
            why = f": {self.error}" if self.error else ""
            raise EngineNotReady(f"the model is not ready (state {self.state}{why})")

    def submit(self, request: CompletionRequest, cancel: CancelToken | None = None) -> Job:
        self._require_ready()
        if request.drafter is not None and request.drafter not in DRAFTERS:
            raise ModelSpecError(f"unknown drafter '{request.drafter}': use one of {', '.join(DRAFTERS)}")
        if request.scope not in SCOPES:
            raise ModelSpecError(f"unknown scope '{request.scope}': use one of {', '.join(SCOPES)}")
        job = Job(request, cancel)
        with self._lock:
            previous = self._jobs.get(request.document)
            self._jobs[request.document] = job
        if previous is not None:
            previous.cancel()  # latest wins, even inside the verify loop
        inner = self._call(lambda: self._run(job))
        inner.add_done_callback(lambda f: self._settle(job, f))
        return job

    def _settle(self, job: Job, inner: concurrent.futures.Future) -> None:
        with self._lock:
            if self._jobs.get(job.request.document) is job:
                del self._jobs[job.request.document]
        if job.future.done():  # a caller cancelled the future itself; nobody waits for the result
            return
        if inner.exception() is not None:
            job.future.set_exception(inner.exception())
        else:
            job.future.set_result(inner.result())

    def complete(self, request: CompletionRequest, cancel: CancelToken | None = None) -> CompletionResult:
        return self.submit(request, cancel).result()

    def _run(self, job: Job) -> CompletionResult:
        from decoding.drafters.base import DraftContext
        from decoding.languages import language_from_path
        from decoding.runner import Cancelled
        from decoding.sampling import Sampler
        from decoding.speculative import Finish, speculative_decode
        from decoding.stop_rules import StopRules, resolve_scope
        from decoding.policy import DraftPolicy

        req, cancel = job.request, job.cancel_token
        mode = req.drafter or self.config.drafter
        stats = RequestStats(drafter=mode)
        started = time.perf_counter()
        text = ""
        if cancel.cancelled:  # cancelled while queued: no model time spent
            stats.stopped = "cancelled"
            return self._record(CompletionResult("", stats))
        runner = self.target_runner
        runner.on_forward = lambda: cancel.cancelled and self._count_after_cancel(stats)
        prompt = self.build_prompt(req)
        stats.prompt_tokens = len(prompt)
        language = req.language or language_from_path(req.path)
        scope = resolve_scope(req.prefix, req.suffix, language, req.scope)
        rules = StopRules.for_request(req.prefix, req.suffix, language, scope)
        max_tokens = req.max_tokens or self.config.max_tokens
        sampler = Sampler(req.temperature, req.top_p, req.top_k, req.seed)
        drafters = dict(self.drafters)
        policy = DraftPolicy(mode, drafters, self.cost, stats)
        if scope == "full":  # the model's raw output up to end-of-text or max tokens (benchmarks compare it)
            text_rule = final_rule = lambda text: None
        else:
            text_rule, final_rule = rules.check, rules.finish
        finish = Finish(self.end_ids, max_tokens, self._decode, text_rule, final_rule,
                        time.monotonic() + req.time_limit_s if req.time_limit_s else None)
        seq = list(prompt)
        generated: list[int] = []
        failed = True
        try:
            stats.reused_prompt_tokens = runner.start(prompt, req.document)
            runner.sync(seq, cancel)
            stats.prefill_ms = (time.perf_counter() - started) * 1000
            policy.begin(DraftContext(prompt, req.prefix, req.suffix, req.document, sampler, cancel))
            try:
                # The draft model reads the prompt when it first drafts, if the policy lets it: on a
                # CPU that reading can cost more than its drafts save (see DraftPolicy).
                if faults.trip("generate_oom"):
                    raise MemoryError("injected fault: out of memory while generating")
                generated = speculative_decode(runner, seq, policy, sampler, finish, cancel, stats, started)
                failed = False
            finally:
                policy.end(failed)
        except Cancelled:  # raised between prefill chunks: the cache is consistent
            stats.stopped = "cancelled"
            failed = False
        except (MemoryError, RuntimeError) as exc:  # torch's OutOfMemoryError is a RuntimeError
            self._drop_caches()
            oom = isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()
            what = "out of memory" if oom else (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DraftwiseError(f"generation failed: {what}; caches were dropped") from exc
        finally:
            runner.discard() if failed else runner.finish()
            runner.on_forward = None
        stats.decode_ms = (time.perf_counter() - started) * 1000 - stats.prefill_ms
        # A cancelled request keeps what it had; otherwise Finish says where the completion ends
        # (speculation may have accepted a few tokens past that point).
        kept = generated if stats.stopped == "cancelled" else generated[:finish.keep_tokens]
        stats.generated_tokens = len(kept)
        text = self._decode(kept)
        if finish.keep_chars is not None:
            text = text[:finish.keep_chars]
        if stats.stopped != "cancelled":
            self.memory.remember(req.document, req.prefix, req.suffix, text)
        result = CompletionResult(text, stats)
        if req.alternatives and stats.stopped not in ("cancelled", "error"):
            # After the greedy run, which they leave untouched (see decoding/alternatives.py).
            from decoding import alternatives
            result.alternatives = alternatives.generate(self, req, prompt, text, finish, cancel, req.alternatives)
        return self._record(result)

    def remember(self, document: str, prefix: str, suffix: str, text: str) -> None:
        """A suggestion the user took (an alternative, or part of one): the suggestion drafter
        drafts the rest of it when the next request runs along it."""
        self._require_ready()
        self._call(lambda: self.memory.remember(document, prefix, suffix, text))

    def _drop_caches(self) -> None:
        """After a failure (e.g. out of memory) free what the caches hold; the next request starts cold."""
        self.target_runner.store.clear()
        if "model" in self.drafters:
            self.drafters["model"].runner.store.clear()
        try:
            import torch

            if self.target.device.type == "cuda":
                torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - best effort
            pass

    @staticmethod
    def _count_after_cancel(stats: RequestStats) -> None:
        stats.forwards_after_cancel += 1

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _record(self, result: CompletionResult) -> CompletionResult:
        s, c = result.stats, self._cumulative
        with self._lock:
            self._requests += 1
            self._last = s
            for f in fields(RequestStats):
                v = getattr(s, f.name)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    setattr(c, f.name, getattr(c, f.name) + v)
                elif isinstance(v, dict):
                    merged = getattr(c, f.name)
                    for k, n in v.items():
                        merged[k] = merged.get(k, 0) + n
        return result

    # ---- reporting ----------------------------------------------------------------------------
    def info(self) -> dict:
        t = self.target
        return {
            "state": self.state, "error": self.error, "target": self.config.target,
            "target_name": t.name if t else None, "draft": self.config.draft,
            "draft_loaded": self.draft is not None, "draft_note": self.draft_note,
            "drafter": self.config.drafter, "device": str(t.device) if t else self.config.device,
            "dtype": str(t.dtype).replace("torch.", "") if t else self.config.dtype,
            "weights": t.weights if t else None,
            "weights_reason": self.weights.reason if self.weights else None,
            "weights_choice": self.weights.to_dict() if self.weights else None,
            "draft_weights": self.draft.weights if self.draft else None,
            "fim_template": self.prompts.template.family if self.prompts else None,
            "cost_model": self.cost.summary() if self.cost else None,
        }

    def stats(self) -> dict:
        with self._lock:
            cumulative = replace(self._cumulative, drafted_by=dict(self._cumulative.drafted_by),
                                 accepted_by=dict(self._cumulative.accepted_by),
                                 decisions=dict(self._cumulative.decisions))
            last = self._last
            n = self._requests
        return {"requests": n, "cumulative": cumulative.to_dict(), "last": last.to_dict() if last else None}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            for job in self._jobs.values():
                job.cancel()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
