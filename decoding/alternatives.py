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
from typing import Callable

from decoding.api import CancelToken, CompletionRequest, RequestStats

log = logging.getLogger("draftwise.alternatives")

CANDIDATES_PER_ALTERNATIVE = 4  # first tokens looked at per wanted alternative (some give duplicates)


def generate(engine, request: CompletionRequest, prompt: list[int], greedy_text: str, finish,
             cancel: CancelToken, count: int) -> list[str]:
    """Up to `count` texts, each distinct from greedy_text and from each other, best first token first.

    `finish` is the greedy run's Finish (its rules are reused; its state is not touched). Runs on the
    engine's worker thread, after the greedy run handed its cache back to the store."""
    from decoding.drafters.base import DraftContext
    from decoding.policy import DraftPolicy
    from decoding.runner import Cancelled
    from decoding.sampling import Sampler
    from decoding.speculative import speculative_decode

    if count <= 0 or cancel.cancelled or len(prompt) == 0 or finish.max_tokens < 1:
        return []
    runner = engine.target_runner
    texts: list[str] = []
    seen = {greedy_text.strip()}
    failed = True
    runner.start(prompt, request.document)
    try:
        runner.sync(prompt, cancel)  # normally a crop: the greedy run stored prompt + its suggestion
        first = runner.forward([prompt[-1]])[-1]
        ranked = first.topk(min(first.shape[-1], (count + 1) * CANDIDATES_PER_ALTERNATIVE)).indices.tolist()
        greedy_first = ranked[0]
        candidates = [t for t in ranked if t != greedy_first and t not in finish.end_ids]
        for token in candidates:
            if len(texts) >= count or cancel.cancelled:
                break
            runner.crop_to(len(prompt))
            text = _continue(engine, runner, request, prompt, token, finish, cancel,
                             DraftPolicy, DraftContext, Sampler, speculative_decode)
            if text is None:  # cancelled
                break
            key = text.strip()
            if key and key not in seen:
                seen.add(key)
                texts.append(text)
        failed = False
    except Cancelled:
        failed = False
    finally:
        runner.discard() if failed else runner.finish()
    return texts


def _continue(engine, runner, request: CompletionRequest, prompt: list[int], token: int, finish, cancel,
              DraftPolicy, DraftContext, Sampler, speculative_decode) -> str | None:
    """The text of first token `token` continued greedily; None when cancelled."""
    import time

    decode: Callable[[list[int]], str] = engine._decode
    # The stop rules must see the first token too: decode it with every check.
    alt_finish = replace(finish, decode=lambda ids: decode([token] + ids), max_tokens=finish.max_tokens - 1,
                         keep_tokens=0, keep_chars=None)
    seq = list(prompt) + [token]
    scratch = RequestStats(drafter="lookup")  # the greedy request's stats stay about the greedy run
    policy = DraftPolicy("lookup", dict(engine.drafters), engine.cost, scratch)
    policy.begin(DraftContext(seq, request.prefix, request.suffix, request.document, Sampler(0.0), cancel))
    try:
        if alt_finish.max_tokens == 0:
            generated: list[int] = []
            alt_finish.check(generated)
        else:
            generated = speculative_decode(runner, seq, policy, Sampler(0.0), alt_finish, cancel, scratch,
                                           time.perf_counter())
    finally:
        policy.end(False)
    if scratch.stopped == "cancelled":
        return None
    text = decode([token] + generated[:alt_finish.keep_tokens])
    if alt_finish.keep_chars is not None:
        text = text[:alt_finish.keep_chars]
    return text
