"""Running a request's plan on the loaded models: prefill what the stored cache lacks, then the verify
loop; the result, and where and why it stopped."""
from __future__ import annotations

import time
from dataclasses import replace

from decoding import faults
from decoding.api import CancelToken, CompletionResult
from decoding.errors import DraftwiseError
from decoding.loading import LoadedModels
from decoding.request_plan import RequestPlan
from decoding.runners import Cancelled, read_ahead
from decoding.speculative import Stop, speculative_decode


def run_plan(models: LoadedModels, plan: RequestPlan, cancel: CancelToken) -> tuple[CompletionResult, Stop]:
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
    return CompletionResult(stop.text(generated, plan.rule.decode), stats), stop


def read_prompt_ahead(models: LoadedModels, request, cancel: CancelToken) -> int:
    """Idle work: read the prompt this request would have into the target's KV cache, and a draft
    model's, so the request starts from them when the user asks. Returns the target tokens read."""
    prompt = models.build_prompt(request)
    try:
        read = read_ahead(models.target_runner, prompt, request.document, cancel)
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


def _generate(models: LoadedModels, plan: RequestPlan, cancel: CancelToken,
              started: float) -> tuple[list[int], Stop]:
    request, seq = plan.request, list(plan.prompt)
    try:
        models.target_runner.sync(seq, cancel, unread=models.target_runner.prompt_tail)
    except Cancelled:  # raised between prefill chunks: the cache is consistent
        return [], Stop("cancelled", 0)
    plan.stats.prefill_ms = (time.perf_counter() - started) * 1000
    # maxTimeMs caps generation, as the settings say: its clock starts once the prompt is read (a cold
    # prompt's seconds of prefill on a CPU must not cut every suggestion at its first line end)
    if request.time_limit_s:
        plan.rule = replace(plan.rule, deadline=time.monotonic() + request.time_limit_s)
    # The draft model reads the prompt when it first drafts, if the policy lets it: on a CPU that
    # reading can cost more than its drafts save (see CostModel.price).
    plan.policy.begin(plan.prompt, request, plan.sampler, cancel, plan.healing)
    try:
        if faults.trip("generate_oom"):
            raise MemoryError("injected fault: out of memory while generating")
        result = speculative_decode(models.target_runner, seq, plan.policy, plan.sampler, plan.rule, cancel,
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
