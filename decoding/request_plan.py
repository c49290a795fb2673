"""A request's plan: `build_plan` decides everything about it (prompt, scope and stop rules, sampler,
drafting policy) before any model time is spent; decoding/request_run.py runs it."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

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


def build_prompt(models: LoadedModels, request: CompletionRequest) -> list[int]:
    from decoding.prompt import valid_text

    context = [replace(f, text=valid_text(f.text)) for f in request.context]
    return models.prompts.build(valid_text(request.prefix), valid_text(request.suffix), request.path, context,
                                budget=request.context_tokens).ids


def _never(text: str) -> None:
    return None


def build_plan(models: LoadedModels, config: EngineConfig, request: CompletionRequest) -> RequestPlan:
    from decoding.languages import language_from_path
    from decoding.stop_rules import StopRules, resolve_scope

    mode = request.drafter or config.drafter
    stats = RequestStats(drafter=mode)
    language = request.language or language_from_path(request.path)
    scope = resolve_scope(request.prefix, request.suffix, language, request.scope)
    if scope == "full":  # the model's raw output up to end-of-text or max tokens (benchmarks compare it)
        text_rule, final_rule = _never, _never
    else:
        rules = StopRules.for_request(request.prefix, request.suffix, language, scope)
        text_rule, final_rule = rules.check, rules.finish
    deadline = time.monotonic() + request.time_limit_s if request.time_limit_s else None
    rule = StopRule(models.end_ids, request.max_tokens or config.max_tokens, models.decode, text_rule, final_rule,
                    deadline)
    sampler = Sampler(request.temperature, request.top_p, request.top_k, request.seed)
    return RequestPlan(request, build_prompt(models, request), rule, sampler,
                       DraftPolicy(mode, models.drafters, models.cost, stats), stats)
