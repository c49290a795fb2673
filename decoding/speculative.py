"""The verify loop: draft, verify all drafted tokens in one target forward, keep what matches."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from decoding.api import CancelToken, RequestStats
from decoding.healing import Constraint
from decoding.policy import DraftPolicy
from decoding.runners.base import Runner
from decoding.sampling import Sampler
from decoding.stop_rules import kept_past_time_cap


@dataclass(frozen=True)
class Stop:
    """Why a completion ended and how much of the generated output it keeps (speculation may have
    accepted tokens past the end, which plain decoding would never have produced)."""

    reason: str  # one of decoding.api.STOP_REASONS
    keep_tokens: int
    keep_chars: int | None = None  # cut the kept tokens' text here (a stop rule fired mid-token)

    def text(self, generated: list[int], decode: Callable[[list[int]], str]) -> str:
        text = decode(generated[:self.keep_tokens])
        return text if self.keep_chars is None else text[:self.keep_chars]


@dataclass
class TimeCap:
    """A request's time cap (maxTimeMs), fixed when its plan is made. Its clock starts when generation
    does, once the prompt is read: a cold prompt's seconds of prefill on a CPU must not cut every
    suggestion at its first line end. The first start wins, so the alternatives generated after the
    greedy suggestion share its cap."""

    seconds: float | None = None
    deadline: float | None = None  # time.monotonic() value, once started

    def start(self) -> None:
        if self.seconds and self.deadline is None:
            self.deadline = time.monotonic() + self.seconds

    def passed(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


@dataclass(frozen=True)
class EndCondition:
    """When a completion is over. `check` sees every generated token."""

    end_ids: frozenset[int]
    max_tokens: int
    decode: Callable[[list[int]], str]
    text_rule: Callable[[str], int | None]  # EndConditions.check: chars to keep, or None to go on
    final_rule: Callable[[str], int | None]  # EndConditions.finish: chars to keep when generation ends otherwise
    time_cap: TimeCap = field(default_factory=TimeCap)
    # Past the time cap: end at the next line end (never half a line on screen), or at once (False:
    # the "full" scope, whose raw output is cut wherever it is).
    whole_lines: bool = True
    # Told the completion's text after each step (a job's text so far: idle work compares it with
    # what the user types meanwhile, lsp_server/idle_work.py).
    seen: Callable[[str], None] | None = None

    def check(self, generated: list[int]) -> Stop | None:
        n = min(len(generated), self.max_tokens)
        eos = next((i for i, tok in enumerate(generated[:n]) if tok in self.end_ids), None)
        upto = n if eos is None else eos
        # Text rules see exactly the text plain decoding would have seen, even when one step
        # accepted several tokens and an end-of-text among them.
        text = self.decode(generated[:upto]).rstrip("\ufffd")  # an unfinished UTF-8 sequence is not text yet
        if self.seen is not None:
            self.seen(text)
        cut = self.text_rule(text)
        if cut is not None:
            return Stop("stop_rule", upto, cut)
        if eos is not None:
            return Stop("eos", eos, self._keep(text))
        if len(generated) >= self.max_tokens:
            return Stop("max_tokens", n, self._keep(text))
        if self.time_cap.passed():
            return self._past_time_cap(n, text)
        return None

    def _keep(self, text: str) -> int:
        """Characters kept when generation ends here: the final rule's, else all of `text` (which
        has no unfinished UTF-8 sequence at its end: that is not text yet)."""
        keep = self.final_rule(text)
        return len(text) if keep is None else keep

    def _past_time_cap(self, n: int, text: str) -> Stop | None:
        kept = kept_past_time_cap(text, self.whole_lines)
        return None if kept is None else Stop("time_limit", n, self._keep(kept))


def speculative_decode(target: Runner, seq: list[int], policy: DraftPolicy, sampler: Sampler,
                       end: EndCondition, cancel: CancelToken, stats: RequestStats,
                       healing: Constraint | None = None) -> tuple[list[int], Stop]:
    """seq: the prompt; the target's cache must hold seq[:-1], or less of it: the first forward reads
    the rest (runner.sync's `unread`). Returns every generated token and where the completion stops
    (a cancelled one keeps what it has). healing: the first tokens write the healed text (every row
    of a forward whose tokens before it have not written it yet is limited; plain decoding does the same)."""
    prompt_len, started = len(seq), time.perf_counter()
    end.time_cap.start()
    while True:
        if cancel.cancelled:
            break
        draft = policy.propose(seq, end.max_tokens - (len(seq) - prompt_len))
        if cancel.cancelled:
            break
        t_forward, cached = time.perf_counter(), len(target.tokens)
        fed = seq[cached:] + (draft.tokens if draft else [])
        logits = target.forward(fed, logits_to_keep=1 + (len(draft) if draft else 0))
        if healing is not None:
            healing.limit_rows(logits, seq[prompt_len:], draft.tokens if draft else [])
        stats.target_forwards += 1
        new = sampler.verify(logits, draft)  # accepted draft tokens + one token of the target's own
        target.crop_to(len(seq) + len(new) - 1)  # rejected draft tokens leave the cache
        policy.observe(draft, len(new) - 1, time.perf_counter() - t_forward, len(fed), cached)
        seq.extend(new)
        if stats.target_forwards == 1:
            stats.first_token_ms = stats.prefill_ms + (time.perf_counter() - started) * 1000
        stop = end.check(seq[prompt_len:])
        if stop is not None:
            return seq[prompt_len:], stop
    return seq[prompt_len:], Stop("cancelled", len(seq) - prompt_len)
