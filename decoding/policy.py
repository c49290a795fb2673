"""Each step: which drafter to verify, and how many of its tokens — or none at all."""
from __future__ import annotations

from decoding.api import CancelToken, CompletionRequest, RequestStats
from decoding.cost_model import CostModel, Plan
from decoding.drafters.base import Draft, DraftContext, Drafter
from decoding.healing import Constraint


class DraftPolicy:
    """`auto` lets the cost model pick among every drafter and plain decoding. A named drafter
    (`lookup`, `model`, `suggestion`) always drafts when it has something, with the cost model
    choosing the length. `none` is plain decoding."""

    def __init__(self, mode: str, drafters: dict[str, Drafter], cost: CostModel, stats: RequestStats):
        self.cost = cost
        self.stats = stats
        self.auto = mode == "auto"
        if mode == "auto":
            self.drafters = dict(drafters)
        else:  # "none", or a drafter that is not loaded, leaves nothing to draft with
            self.drafters = {mode: drafters[mode]} if mode in drafters else {}

    def begin(self, prompt_ids: list[int], request: CompletionRequest, sampler, cancel: CancelToken,
              healing: Constraint | None = None) -> None:
        """A request starts decoding after prompt_ids; sampler: decoding.sampling.Sampler. healing: the
        text the model writes first (decoding/healing.py), which the hint, a completion's text, lacks,
        and which limits a draft model's first tokens as it limits the target's."""
        self.cost.acceptance.new_request()
        healed = healing.healed if healing is not None else ""
        hint = healed + request.draft_hint if request.draft_hint else ""
        ctx = DraftContext(prompt_ids, request.prefix, request.suffix, request.document, sampler, cancel, hint,
                           healing, tuple(request.lookup_texts))
        for d in self.drafters.values():
            d.begin(ctx)

    def end(self, failed: bool = False) -> None:
        for d in self.drafters.values():
            d.end(failed)

    def propose(self, seq: list[int], room: int) -> Draft | None:
        """room: how many more tokens the request may emit (the target's own token is one of them)."""
        best = None
        for name, drafter in self.drafters.items():
            offer = drafter.offer(seq, room - 1)
            if offer is None:
                continue
            plan = self.cost.price(name, offer, room, len(seq))
            if not self.auto:  # a named drafter drafts whenever it can
                plan = Plan(name, max(plan.k, 1), plan.rate, True)
            if plan.pays and (best is None or plan.rate > best.rate):
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

    def observe(self, draft: Draft | None, accepted: int, forward_s: float, fed: int, length: int | None = None) -> None:
        """After a verify forward of `fed` tokens (the draft, the last token, on a request's first
        forward maybe more of the prompt) on a cache of `length` tokens: keep forward costs and
        acceptance estimates current."""
        self.cost.t.observe(fed, forward_s, length=length)
        if not draft or not draft.tokens:
            return
        self.cost.acceptance.record(draft.key, len(draft), accepted)
        self.stats.accepted_tokens += accepted
        self.stats.accepted_by[draft.source] = self.stats.accepted_by.get(draft.source, 0) + accepted
