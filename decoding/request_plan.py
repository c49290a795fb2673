"""A request's plan: `build_plan` decides everything about it (prompt, scope and stop rules, sampler,
drafting policy) before any model time is spent; decoding/request_run.py runs it."""
from __future__ import annotations

import time
from dataclasses import dataclass

from decoding.api import CompletionRequest, EngineConfig, RequestStats
from decoding.loading import LoadedModels
from decoding.policy import DraftPolicy
from decoding.sampling import Sampler
from decoding.speculative import StopRule


@dataclass
class RequestPlan:
    request: CompletionRequest
    prompt: list[int]
    rule: StopRule
    sampler: Sampler
    policy: DraftPolicy
    stats: RequestStats


def build_plan(models: LoadedModels, config: EngineConfig, request: CompletionRequest) -> RequestPlan:
    from decoding.stop_rules import completion_rules

    mode = models.drafter_mode(request.drafter or config.drafter)
    stats = RequestStats(drafter=mode)
    text_rule, final_rule = completion_rules(request.prefix, request.suffix, request.language, request.path,
                                             request.scope)
    deadline = time.monotonic() + request.time_limit_s if request.time_limit_s else None
    rule = StopRule(models.end_ids, request.max_tokens or config.max_tokens, models.decode, text_rule, final_rule,
                    deadline, whole_lines=request.scope != "full")
    sampler = Sampler(request.temperature, request.top_p, request.top_k, request.seed)
    return RequestPlan(request, models.build_prompt(request), rule, sampler,
                       DraftPolicy(mode, models.drafters, models.cost, stats), stats)
