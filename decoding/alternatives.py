"""Alternatives to the greedy suggestion, for an explicitly invoked completion.

The greedy suggestion is decoded first and exactly as without alternatives (so it stays identical to
plain greedy decoding). Then, on the same worker thread and with the prompt's KV cache that the greedy
run just stored:

1. one forward of the prompt's last token gives the first-token distribution (the greedy run did not
   keep its logits);
2. the next-best first tokens (not the greedy one, not an end-of-text token) are taken in order;
3. each is continued greedily through the ordinary verify loop with the lookup drafter, under the same
   stop rules as the greedy suggestion; the cache is cropped back to the prompt between them, so the
   prompt is never read again.

Cost: one extra one-token forward, plus one forward per emitted token of each alternative (fewer when
lookup drafts hit), bounded by max_tokens each. That is paid only when the user asked (manual
trigger), never on automatic triggers, and a cancel (a keystroke) stops it between forwards like any
other request. Beam search would cost as much per step for every beam and still need the greedy run
to stay lossless; sampling would give duplicates and, with temperature 0, nothing different.
"""
from __future__ import annotations

import logging
from dataclasses import replace

import torch

from decoding.api import Cancelled, CancelToken, RequestStats
from decoding.healing import limited
from decoding.policy import DraftPolicy
from decoding.request import RequestPlan
from decoding.sampling import Sampler
from decoding.speculative import speculative_decode

log = logging.getLogger("draftwise.alternatives")

CANDIDATES_PER_ALTERNATIVE = 4  # first tokens looked at per wanted alternative (some give duplicates)


def generate(models, plan: RequestPlan, greedy_text: str, cancel: CancelToken) -> list[str]:
    """Up to `plan.request.alternatives` texts, each distinct from greedy_text and from each other, best
    first token first. Runs on the engine's worker thread, after the greedy run handed its cache back to
    the store; the plan's end condition is reused."""
    count, prompt, end = plan.request.alternatives, plan.prompt, plan.end
    if count <= 0 or cancel.cancelled or len(prompt) == 0 or end.max_tokens < 1:
        return []
    runner = models.target_runner
    texts: list[str] = []
    seen = {greedy_text.strip()}
    runner.start(prompt, plan.request.document)
    try:
        runner.sync(prompt, cancel)  # normally a crop: the greedy run stored prompt + its suggestion
        first = runner.forward([prompt[-1]])[-1]
        if plan.healing is not None:  # the first tokens must write the healed text
            first = limited(first, plan.healing.allowed([]))
        top = first.topk(min(first.shape[-1], (count + 1) * CANDIDATES_PER_ALTERNATIVE))
        ranked = top.indices[torch.isfinite(top.values)].tolist()  # fewer allowed than asked: not the rest
        for token in [t for t in ranked[1:] if t not in end.end_ids]:
            if len(texts) >= count or cancel.cancelled:
                break
            runner.crop_to(len(prompt))
            text = _continue(models, plan, token, cancel)
            if text is None:  # cancelled
                break
            if text.strip() and text.strip() not in seen:
                seen.add(text.strip())
                texts.append(text)
    except Cancelled:
        pass
    except BaseException:
        runner.discard()
        raise
    runner.finish()
    return texts


def _continue(models, plan: RequestPlan, token: int, cancel: CancelToken) -> str | None:
    """The text of first token `token` continued greedily; None when cancelled."""
    decode = plan.end.decode
    # The stop rules must see the first token too: decode it with every check.
    end = replace(plan.end, decode=lambda ids: decode([token] + ids), max_tokens=plan.end.max_tokens - 1)
    seq = list(plan.prompt) + [token]
    scratch = RequestStats(drafter="lookup")  # the greedy request's stats stay about the greedy run
    policy = DraftPolicy(models.drafter_mode("lookup"), models.drafters, models.cost, scratch)
    healing = plan.healing.after([token]) if plan.healing is not None else None  # the rest of the healed text
    policy.begin(seq, replace(plan.request, draft_hint=""), Sampler(0.0), cancel, healing)
    try:
        if end.max_tokens == 0:
            generated, stop = [], end.check([])
        else:
            generated, stop = speculative_decode(models.target_runner, seq, policy, Sampler(0.0), end, cancel,
                                                 scratch, healing)
    finally:
        policy.end()
    if stop.reason == "cancelled":
        return None
    return stop.text(generated, end.decode)
