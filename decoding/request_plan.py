"""A request's plan: `build_plan` decides everything about it (prompt, scope and stop rules, sampler,
drafting policy) before any model time is spent; decoding/request_run.py runs it."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from decoding.api import CompletionRequest, EngineConfig, RequestStats
from decoding.healing import Constraint, without_healed
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
    healing: Constraint | None = None  # the blank the completion must write first (decoding/healing.py)


def build_plan(models: LoadedModels, config: EngineConfig, request: CompletionRequest,
               seen: Callable[[str], None] | None = None) -> RequestPlan:
    """seen: told the completion's text so far after each step (StopRule.seen)."""
    from decoding.stop_rules import completion_rules

    mode = models.drafter_mode(request.drafter or config.drafter)
    stats = RequestStats(drafter=mode)
    text_rule, final_rule = completion_rules(request.prefix, request.suffix, request.language, request.path,
                                             request.scope)
    deadline = None  # request.time_limit_s: set when generation starts (decoding/request_run.py)
    prompt = models.prompt_parts(request)
    healing, decode = None, models.decode
    if prompt.healed:  # the text rules and the result see the completion without it
        healing = Constraint(models.healing, prompt.healed)
        decode = lambda ids: without_healed(prompt.healed, models.decode(ids))  # noqa: E731
    rule = StopRule(models.end_ids, request.max_tokens or config.max_tokens, decode, text_rule, final_rule,
                    deadline, whole_lines=request.scope != "full", seen=seen)
    sampler = Sampler(request.temperature, request.top_p, request.top_k, request.seed)
    return RequestPlan(request, prompt.ids, rule, sampler, DraftPolicy(mode, models.drafters, models.cost, stats),
                       stats, healing)
