"""The cost model and the per-step policy, on forward-time tables shaped like a CPU and like a GPU.

The times are made up (the real ones are measured at load); what is tested is the decision each
table leads to, which is what makes `auto` fast on one device and harmless on another.
"""
from __future__ import annotations

import pytest

from decoding.api import CancelToken, CompletionRequest, RequestStats
from decoding.cost_model import CostModel, expected_tokens
from decoding.runners.timing import ForwardTimes
from decoding.drafters.base import Draft, Drafter, Offer
from decoding.policy import DraftPolicy
from decoding.sampling import Sampler

# Seconds per target forward by number of tokens fed.
CPU = {1: 0.30, 2: 0.34, 4: 0.47, 8: 0.67, 12: 0.82, 16: 0.89, 17: 0.90}  # a 1.5B on 2 cores
GPU = {1: 0.020, 2: 0.020, 4: 0.021, 8: 0.021, 12: 0.022, 16: 0.022, 17: 0.023}


def cost(table, **kw) -> CostModel:
    return CostModel(ForwardTimes(dict(table)), **kw)


def test_expected_tokens_counts_the_targets_own_token():
    assert expected_tokens(0.0, 8) == 1.0
    assert expected_tokens(1.0, 8) == 9.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_long_drafts_on_a_gpu_short_ones_or_none_on_a_cpu():
    k_gpu, _ = cost(GPU).best_k(0.8, 16)
    k_cpu, _ = cost(CPU).best_k(0.8, 16)
    assert k_gpu >= 8 and 1 <= k_cpu < k_gpu
    assert cost(CPU).best_k(0.1, 16)[0] == 0  # mostly wrong guesses: plain decoding is faster


def test_a_plan_that_does_not_beat_plain_decoding_drafts_nothing():
    model = cost(CPU)
    model.acceptance.lifetime["weak"] = [1.0, 50.0]
    assert not model.price("lookup", Offer(16, "weak"), 17).pays
    plan = model.price("lookup", Offer(16, "suggestion"), 17)  # prior: suggestions are usually right
    assert plan.pays and plan.k > 0


def test_a_slow_draft_model_does_not_pay_and_a_fast_one_does():
    assert not cost(CPU).drafter_pays(0.25)
    assert cost(CPU).drafter_pays(0.09)
    assert cost(GPU).drafter_pays(0.004)


def test_measured_draft_steps_move_the_model_drafters_estimate(tiny_model_dir):
    from decoding.drafters.draft_model import ModelDrafter

    drafter = ModelDrafter(runner=None, step_s=0.09, prefill_s=0.003)
    for _ in range(50):
        drafter.observe_step(0.2)
    assert drafter.step_s == pytest.approx(0.2, rel=0.02)


def test_amortized_rate():
    assert CostModel.amortized_rate(10.0, 20, 0.0) == 10.0
    assert CostModel.amortized_rate(10.0, 20, 2.0) == pytest.approx(5.0)


class FakeModelDrafter(Drafter):
    """Stands in for the draft model: what matters to the policy is its offer (a step cost and a
    catch-up of `catch_up` prompt tokens) and its answer."""

    name = "model"

    def __init__(self, catch_up: int, draft_step_s: float, draft_prefill_s: float):
        self.catch_up, self.step_s, self.prefill_s = catch_up, draft_step_s, draft_prefill_s

    def offer(self, seq, room):
        return Offer(room, "model", self.step_s, self.catch_up * self.prefill_s)

    def propose(self, seq, k):
        return Draft([7] * k, self.name, key="model")


def policy(table, catch_up, mode="auto", **drafter_costs) -> DraftPolicy:
    p = DraftPolicy(mode, {"model": FakeModelDrafter(catch_up, **drafter_costs)}, cost(table), RequestStats())
    p.begin([1, 2, 3], CompletionRequest(prefix="", document="d"), Sampler(0.0), CancelToken())
    return p


# 1,000 prompt tokens for the draft model to read first; a 0.5B on a CPU reads one in ~3 ms.
def test_auto_leaves_the_draft_model_out_when_catching_up_costs_more_than_it_saves():
    p = policy(CPU, 1000, draft_step_s=0.09, draft_prefill_s=0.003)
    assert p.propose([1, 2, 3], room=48) is None
    assert p.stats.decisions == {"none": 1}


def test_auto_uses_the_draft_model_once_its_cache_holds_the_prompt():
    p = policy(CPU, 2, draft_step_s=0.09, draft_prefill_s=0.003)
    draft = p.propose([1, 2, 3], room=48)
    assert draft is not None and draft.source == "model" and len(draft) >= 1


def test_a_long_completion_can_pay_for_the_catch_up():
    p = policy(CPU, 1000, draft_step_s=0.09, draft_prefill_s=0.003)
    assert p.propose([1, 2, 3], room=2000) is not None


def test_on_a_gpu_the_catch_up_is_cheap_and_the_model_drafts():
    p = policy(GPU, 1000, draft_step_s=0.004, draft_prefill_s=0.00002)
    draft = p.propose([1, 2, 3], room=48)
    assert draft is not None and len(draft) >= 2


def test_a_named_drafter_drafts_whatever_it_costs():
    p = policy(CPU, 1000, mode="model", draft_step_s=0.09, draft_prefill_s=0.003)
    assert p.propose([1, 2, 3], room=48) is not None


def test_failing_drafts_of_one_drafter_lower_its_other_buckets_within_the_request():
    from decoding.cost_model import PRIORS, Acceptance

    acc = Acceptance()
    a0, b0 = PRIORS["lookup:n4"]
    assert acc.alpha("lookup:n4") == pytest.approx(a0 / (a0 + b0))
    for _ in range(3):  # three 3-token lookup drafts rejected at their first token
        acc.record("lookup:n3", 3, 0)
    assert acc.alpha("lookup:n4") < a0 / (a0 + b0) - 0.1, "the same drafter misled this request"
    assert acc.alpha("repo:n4") == pytest.approx(PRIORS["repo:n4"][0] / sum(PRIORS["repo:n4"]))  # another drafter
    acc.new_request()
    lowered_by_history = acc.alpha("lookup:n4")
    assert lowered_by_history > a0 / (a0 + b0) - 0.1, "a new request keeps only the decayed lifetime counts"


def test_on_a_long_cache_verify_rows_cost_more_and_a_marginal_draft_stops_paying():
    """Timed on a 128- and a 512-token cache (made-up times, shaped like the 0.5B int4's: forwards cost
    more on a longer cache, verify rows more than a step): a one-token lookup draft that pays on a
    short prompt loses on a long one, and the model must know it."""
    short = {1: 0.030, 2: 0.037, 4: 0.044, 8: 0.052, 16: 0.068}
    long_ = {1: 0.036, 2: 0.048, 4: 0.052, 8: 0.064, 16: 0.085}
    t = ForwardTimes(dict(short), dict(long_), (128, 512))
    assert t(2) == t(2, 128) == t(2, 64) == 0.037 and t(2, 512) == 0.048
    assert t(1, 1024) == pytest.approx(0.030 + 0.006 * 896 / 384)  # attention grows with the cache
    model = CostModel(t)
    model.acceptance.lifetime["lookup:n1"] = [20.0, 20.0]  # with the prior: right about two times in five
    assert model.price("lookup", Offer(1, "lookup:n1"), 40, length=128).pays
    assert not model.price("lookup", Offer(1, "lookup:n1"), 40, length=1024).pays
    before = t(2, 1024)
    t.observe(2, 2 * before, length=1024)  # the machine got slower: both tables follow
    assert t(1, 128) == pytest.approx(1.05 * 0.030) and t(1, 512) == pytest.approx(1.05 * 0.036)
    assert 1.05 * before < t(2, 1024) < 1.1 * before  # and the width that ran a little more


def test_a_long_good_history_does_not_keep_a_failing_request_drafting():
    from decoding.cost_model import Acceptance

    acc = Acceptance()
    for _ in range(400):  # many earlier requests: 3-token lookup drafts, 4 of 6 tokens accepted
        acc.record("lookup:n3", 3, 3)
        acc.record("lookup:n3", 3, 1)
    acc.new_request()
    start = acc.alpha("lookup:n3")
    assert start > 0.65  # the history sets where a request starts
    for _ in range(4):  # this file's repeats mislead: four drafts rejected at their first token
        acc.record("lookup:n3", 3, 0)
    # (with the history at full weight, 490 decayed drafts at a quarter each, it stayed at 0.79)
    assert acc.alpha("lookup:n3") < start - 0.2
