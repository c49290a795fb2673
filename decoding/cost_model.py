"""Which drafter, and how many tokens, pay on this device — measured, not assumed.

At load the engine times target forwards of 1..16 new tokens (and a draft-model step). On a GPU a
16-token forward costs about as much as a 1-token one, so long drafts are nearly free; on a laptop CPU
verifying 8 tokens costs ~2.7 decode steps, so a draft must be likely right to pay.

Each step, for each available proposal, expected tokens from verifying k drafted tokens with
per-token acceptance a is E(k) = 1 + a + ... + a^k (the target always adds one token of its own);
the step costs T(k) = t_target(k + 1) + k * t_draft. The engine verifies the (drafter, k) with the
highest E/T, and decodes plainly when nothing beats 1 / t_target(1).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from decoding.drafters.base import Offer
from decoding.runners.timing import ForwardTimes

log = logging.getLogger(__name__)

# Prior acceptance per bucket (successes, failures): lookup matches get more trustworthy with length.
PRIORS = {
    "lookup:n8": (3.0, 1.0), "lookup:n6": (2.5, 1.0), "lookup:n4": (2.0, 1.5), "lookup:n3": (1.5, 1.5),
    "lookup:n2": (1.0, 2.0), "lookup:n1": (0.5, 2.5), "suggestion": (8.0, 1.0), "model": (3.0, 1.0),
    # matches in the repository beyond the prompt (drafters/lookup.py): less about this request
    "repo:n6": (2.0, 1.5), "repo:n4": (1.5, 1.5), "repo:n3": (1.0, 2.0),
}
GLOBAL_WEIGHT = 0.25  # how much earlier requests count next to this one
# How much this request's drafts (accepted and failed) from the same drafter's other buckets count: a
# file whose repeats mislead (lookup matches that keep failing, whatever their length) should stop
# costing verify forwards after a few, not after a few per bucket.
FAMILY_WEIGHT = 0.5
GLOBAL_DECAY = 0.995
# Earlier requests count as at most this many drafts, however many there were: they set where this
# request starts, and this request's own failures must be able to stop its drafting within a few
# drafts (with the lifetime's full weight, a day of 60% acceptance kept a file whose every draft
# failed drafting to its end, 0.87x of plain decoding).
LIFETIME_STRENGTH = 6.0
MIN_GAIN = 1.03  # a draft must promise 3% more tokens per second than plain decoding


def expected_tokens(alpha: float, k: int) -> float:
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class Acceptance:
    """Per-bucket acceptance: this request's counts, plus decayed counts from earlier requests."""

    lifetime: dict[str, list[float]] = field(default_factory=dict)
    request: dict[str, list[float]] = field(default_factory=dict)

    def new_request(self) -> None:
        self.request = {}

    def alpha(self, key: str) -> float:
        a0, b0 = PRIORS.get(key, (1.0, 1.0))
        gs, gf = self.lifetime.get(key, (0.0, 0.0))
        rs, rf = self.request.get(key, (0.0, 0.0))
        fs, ff = self._family_in_request(key)
        weight = min(GLOBAL_WEIGHT, LIFETIME_STRENGTH / (gs + gf)) if gs + gf > 0 else 0.0
        s = a0 + weight * gs + rs + FAMILY_WEIGHT * fs
        f = b0 + weight * gf + rf + FAMILY_WEIGHT * ff
        return s / (s + f)

    def _family_in_request(self, key: str) -> tuple[float, float]:
        """This request's counts over the other buckets of key's drafter (`lookup:n3` -> `lookup:*`)."""
        family = key.split(":", 1)[0]
        s = f = 0.0
        for other, (os_, of) in tuple(self.request.items()):  # stats read it from another thread
            if other != key and other.split(":", 1)[0] == family:
                s, f = s + os_, f + of
        return s, f

    def record(self, key: str, proposed: int, accepted: int) -> None:
        # Each drafted token up to the first rejection is one trial; the rejection is one failure.
        fail = 1.0 if accepted < proposed else 0.0
        for table, decay in ((self.lifetime, GLOBAL_DECAY), (self.request, 1.0)):
            s, f = table.get(key, (0.0, 0.0))
            table[key] = [s * decay + accepted, f * decay + fail]


@dataclass
class Plan:
    source: str  # drafter name
    k: int  # the best draft length (0: every length loses to plain decoding)
    rate: float  # expected tokens per second
    pays: bool  # beats plain decoding by MIN_GAIN, counting the catch-up


class CostModel:
    """Prices drafts: every drafter's offer, and whether a draft model can pay on this device."""

    def __init__(self, target: ForwardTimes, max_draft: int = 16):
        self.t = target
        self.max_draft = max_draft
        self.acceptance = Acceptance()

    @staticmethod
    def amortized_rate(rate: float, tokens: int, upfront_s: float) -> float:
        """Tokens per second over `tokens` tokens at `rate`, after `upfront_s` spent before the first."""
        if upfront_s <= 0 or tokens <= 0:
            return rate
        return tokens / (upfront_s + tokens / rate)

    @property
    def plain_rate(self) -> float:
        return 1.0 / self.t(1)

    def best_k(self, alpha: float, max_k: int, step_cost: float = 0.0, length: int | None = None) -> tuple[int, float]:
        """length: the cache's length (forwards on a longer one cost more, verify rows most)."""
        best = (0, 1.0 / self.t(1, length))
        for k in range(1, min(max_k, self.max_draft) + 1):
            rate = expected_tokens(alpha, k) / (self.t(k + 1, length) + k * step_cost)
            if rate > best[1]:
                best = (k, rate)
        return best

    def price(self, source: str, offer: Offer, room: int, length: int | None = None) -> Plan:
        """The best draft length for this offer, its rate, and whether it pays. room: tokens the
        request may still emit; length: the sequence's length (the target's cache). A one-off
        catch-up is spread over all of them: on a CPU a draft model reading 1,000 prompt tokens
        takes seconds, on a GPU milliseconds."""
        k, rate = self.best_k(self.acceptance.alpha(offer.key), min(offer.tokens, room - 1), offer.step_s, length)
        rate = self.amortized_rate(rate, room, offer.catch_up_s) if k else rate
        return Plan(source, k, rate, k > 0 and rate >= MIN_GAIN / self.t(1, length))

    def drafter_pays(self, step_s: float, alpha: float = 0.9) -> bool:
        """Could a drafter costing step_s a token beat plain decoding when right 90% of the time?"""
        _, rate = self.best_k(alpha, self.max_draft, step_s)
        return rate > self.plain_rate * MIN_GAIN

    def summary(self) -> dict:
        longer = {}
        if self.t.longer is not None:
            longer = {"cache_lengths": list(self.t.lengths),
                      "target_forward_ms_long_cache": {n: round(s * 1000, 1) for n, s in sorted(self.t.longer.items())}}
        return {
            "target_forward_ms": {n: round(s * 1000, 1) for n, s in sorted(self.t.by_tokens.items())},
            **longer,
            "verify8_over_decode": round(self.t(8) / self.t(1), 2),
            "acceptance": {k: round(self.acceptance.alpha(k), 3) for k in sorted(self.acceptance.lifetime)},
        }
