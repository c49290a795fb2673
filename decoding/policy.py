"""Each step: which drafter to verify, and how many of its tokens — or none at all."""
from __future__ import annotations

from decoding.api import RequestStats
from decoding.cost_model import MIN_GAIN, CostModel, Plan
from decoding.drafters.base import Draft, DraftContext, Drafter


class DraftPolicy:
    """`auto` lets the cost model pick among every drafter and plain decoding. A named drafter
    (`lookup`, `model`, `suggestion`) always drafts when it has something, with the cost model
    choosing the length. `none` is plain decoding."""

    def __init__(self, mode: str, drafters: dict[str, Drafter], cost: CostModel, stats: RequestStats):
        self.mode = mode
        self.cost = cost
        self.stats = stats
        if mode == "none":
            self.drafters = {}
        elif mode == "auto":
            self.drafters = drafters
        else:
            self.drafters = {mode: drafters[mode]} if mode in drafters else {}

    def begin(self, ctx: DraftContext) -> None:
        self.cost.acceptance.new_request()
        for d in self.drafters.values():
            d.begin(ctx)

    def end(self, failed: bool = False) -> None:
        for d in self.drafters.values():
            d.end(failed)

    def propose(self, seq: list[int], room: int) -> Draft | None:
        """room: how many more tokens the request may emit (the target's own token is one of them)."""
        best = None
        for name, drafter in self.drafters.items():
            if name == "model":
                plan = self.cost.plan(name, "model", room - 1, self.cost.draft_step_s or 0.0)
                if plan.k and self.mode == "auto":
                    plan = self._with_catch_up(plan, drafter, seq, room)
            else:
                n = drafter.available(seq)
                if n <= 0:
                    continue
                key = drafter.propose(seq, 1).key  # the bucket depends on the match found
                plan = self.cost.plan(name, key, min(n, room - 1))
            if self.mode != "auto" and plan.k == 0 and room > 1:
                plan.k, plan.source = 1, name  # a named drafter drafts whenever it can
            if plan.k and (best is None or plan.rate > best.rate):
                best = plan
        label = f"{best.source}:{best.k}" if best else "none"
        self.stats.decisions[label] = self.stats.decisions.get(label, 0) + 1
        if best is None:
            return None
        draft = self.drafters[best.source].propose(seq, best.k)
        if draft is not None and draft.tokens:
            self.stats.drafted_tokens += len(draft)
            self.stats.drafted_by[draft.source] = self.stats.drafted_by.get(draft.source, 0) + len(draft)
        return draft

    def _with_catch_up(self, plan: Plan, drafter: Drafter, seq: list[int], room: int) -> Plan:
        """Before its first draft the model must read what its cache lacks: on a cold request the
        whole prompt. On a CPU that can cost more than drafting saves over the rest of the request
        (a 0.5B reading 1,000 tokens takes seconds); on a GPU it is milliseconds."""
        catch_up = drafter.catch_up_tokens(seq)
        if not catch_up or not self.cost.draft_prefill_s:
            return plan
        plan.rate = self.cost.amortized_rate(plan.rate, room, catch_up * self.cost.draft_prefill_s)
        if plan.rate < self.cost.plain_rate * MIN_GAIN:
            return Plan("none", 0, self.cost.plain_rate)
        return plan

    def observe(self, draft: Draft | None, accepted: int, forward_s: float) -> None:
        """After a verify forward: keep forward costs and acceptance estimates current."""
        self.cost.t.observe(len(draft) + 1 if draft else 1, forward_s)
        if not draft or not draft.tokens:
            return
        self.cost.acceptance.record(draft.key, len(draft), accepted)
        if draft.source == "model" and draft.cost_s:
            self.cost.observe_draft_step(draft.cost_s / len(draft))
        self.stats.accepted_tokens += accepted
        self.stats.accepted_by[draft.source] = self.stats.accepted_by.get(draft.source, 0) + accepted
