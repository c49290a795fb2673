"""One request, from the engine down to the verify loop. `plan_request` decides everything before any model
time is spent (prompt, stop rules and time cap, sampler, drafting policy); `run_request` reads what the stored
KV cache lacks, then runs the verify loop (decoding/speculative.py) and says where and why it stopped."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from decoding import faults
from decoding.api import Cancelled, CancelToken, CompletionRequest, CompletionResult, EngineConfig, RequestStats
from decoding.errors import DraftwiseError
from decoding.setup import LoadedModels
from decoding.sampling import Sampler
from decoding.speculative import Stop, EndCondition, TimeCap, speculative_decode
from decoding.stop_rules import completion_rules


@dataclass
class RequestPlan:
    request: CompletionRequest
    prompt: list[int]
    end: EndCondition
    sampler: Sampler
    policy: Any  # decoding.policy.DraftPolicy: which drafter drafts how much, step by step
    stats: RequestStats
    healing: Any = None  # decoding.healing.Constraint: the text the completion must write first


def plan_request(models: LoadedModels, config: EngineConfig, request: CompletionRequest,
         seen: Callable[[str], None] | None = None) -> RequestPlan:
    """seen: told the completion's text so far after each step (EndCondition.seen)."""
    mode = models.drafter_mode(request.drafter or config.drafter)
    stats = RequestStats(drafter=mode)
    text_rule, final_rule = completion_rules(request.prefix, request.suffix, request.language, request.path,
                                             request.scope)
    prompt = models.prompt_parts(request)
    decode = models.decode
    if prompt.healed:  # the text rules and the result see the completion without the healed text
        decode = lambda ids: prompt.completion_text(models.decode(ids), ids, models.healing)  # noqa: E731
    end = EndCondition(models.end_ids, request.max_tokens or config.max_tokens, decode, text_rule, final_rule,
                    TimeCap(request.time_limit_s or None), whole_lines=request.scope != "full", seen=seen)
    sampler = Sampler(request.temperature, request.top_p, request.top_k, request.seed)
    return RequestPlan(request, prompt.ids, end, sampler, models.draft_policy(mode, stats), stats,
                       prompt.constraint(models.healing))


def run_request(models: LoadedModels, plan: RequestPlan, cancel: CancelToken) -> tuple[CompletionResult, Stop]:
    """Prefill what the stored cache lacks, then the verify loop. The target's cache goes back to the
    store unless a failure may have left it inconsistent; then every cache is dropped."""
    stats, runner = plan.stats, models.target_runner
    started = time.perf_counter()
    stats.prompt_tokens = len(plan.prompt)
    stats.reused_prompt_tokens = runner.start(plan.prompt, plan.request.document, cancel)
    try:
        generated, stop = _generate(models, plan, cancel, started)
    except (MemoryError, RuntimeError) as exc:  # torch's OutOfMemoryError is a RuntimeError
        runner.discard()
        raise _dropped_caches(models, exc) from exc
    runner.finish()
    stats.forwards_after_cancel = runner.forwards_after_cancel
    stats.decode_ms = (time.perf_counter() - started) * 1000 - stats.prefill_ms
    stats.stopped = stop.reason
    stats.generated_tokens = min(len(generated), stop.keep_tokens)
    return CompletionResult(stop.text(generated, plan.end.decode), stats), stop


def _generate(models: LoadedModels, plan: RequestPlan, cancel: CancelToken,
              started: float) -> tuple[list[int], Stop]:
    request, seq = plan.request, list(plan.prompt)
    try:
        models.target_runner.sync(seq, cancel, unread=models.target_runner.prompt_tail)
    except Cancelled:  # raised between prefill chunks: the cache is consistent
        return [], Stop("cancelled", 0)
    plan.stats.prefill_ms = (time.perf_counter() - started) * 1000
    # The draft model reads the prompt when it first drafts, if the policy lets it: on a CPU that
    # reading can cost more than its drafts save (see CostModel.price).
    plan.policy.begin(plan.prompt, request, plan.sampler, cancel, plan.healing)
    try:
        if faults.trip("generate_oom"):
            raise MemoryError("injected fault: out of memory while generating")
        result = speculative_decode(models.target_runner, seq, plan.policy, plan.sampler, plan.end, cancel,
                                    plan.stats, plan.healing)
    except Cancelled:  # the draft model's catch-up stops between chunks too; its cache stays consistent
        plan.policy.end()
        generated = seq[len(plan.prompt):]
        return generated, Stop("cancelled", len(generated))
    except BaseException:
        plan.policy.end(failed=True)
        raise
    plan.policy.end()
    return result


def read_prompt_ahead(models: LoadedModels, request: CompletionRequest, cancel: CancelToken) -> int:
    """Idle work: read the prompt this request would have into the target's KV cache, and a draft
    model's, so the request starts from them when the user asks. Returns the target tokens read."""
    prompt = models.build_prompt(request)
    try:
        read = models.target_runner.read_ahead(prompt, request.document, cancel)
        for drafter in models.drafters.values():
            drafter.prepare(prompt, request.document, cancel)
    except (MemoryError, RuntimeError) as exc:
        raise _dropped_caches(models, exc) from exc
    return read


def _dropped_caches(models: LoadedModels, exc: BaseException) -> DraftwiseError:
    """After a failure (most likely out of memory) free what the caches hold: the next request starts
    cold. The error to raise, in one line."""
    models.clear_caches()
    oom = isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()
    what = "out of memory" if oom else (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return DraftwiseError(f"generation failed: {what}; caches were dropped")
