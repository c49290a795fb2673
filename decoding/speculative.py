"""The verify loop: draft, verify all drafted tokens in one target forward, keep what matches."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from decoding.api import CancelToken, RequestStats
from decoding.policy import DraftPolicy
from decoding.runner import ModelRunner
from decoding.sampling import Sampler


@dataclass
class Finish:
    """When a completion is over. `check` sees every generated token and returns a stop reason or ''."""

    end_ids: set[int]
    max_tokens: int
    decode: Callable[[list[int]], str]
    text_rule: Callable[[str], int | None]  # StopRules.check: chars to keep, or None to go on
    final_rule: Callable[[str], int | None]  # StopRules.finish: chars to keep when generation ends otherwise
    deadline: float | None = None  # time.monotonic() value
    keep_tokens: int = 0
    keep_chars: int | None = None

    def check(self, generated: list[int]) -> str:
        n = min(len(generated), self.max_tokens)
        eos = next((i for i, tok in enumerate(generated[:n]) if tok in self.end_ids), None)
        upto = n if eos is None else eos
        # Text rules see exactly the text plain decoding would have seen, even when one step
        # accepted several tokens and an end-of-text among them.
        text = self.decode(generated[:upto]).rstrip("\ufffd")  # an unfinished UTF-8 sequence is not text yet
        cut = self.text_rule(text)
        if cut is not None:
            return self._stop("stop_rule", upto, cut)
        if eos is not None:
            return self._stop("eos", eos, self.final_rule(text))
        if len(generated) >= self.max_tokens:
            return self._stop("max_tokens", n, self.final_rule(text))
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return self._stop("time_limit", n, self.final_rule(text))
        return ""

    def _stop(self, reason: str, keep_tokens: int, keep_chars: int | None) -> str:
        self.keep_tokens, self.keep_chars = keep_tokens, keep_chars
        return reason


def speculative_decode(target: ModelRunner, seq: list[int], policy: DraftPolicy, sampler: Sampler,
                       finish: Finish, cancel: CancelToken, stats: RequestStats, started: float) -> list[int]:
    """seq: the prompt; the target's cache must hold seq[:-1]. Returns all generated tokens."""
    prompt_len = len(seq)
    while True:
        if cancel.cancelled:
            stats.stopped = "cancelled"
            break
        draft = policy.propose(seq, finish.max_tokens - (len(seq) - prompt_len))
        if cancel.cancelled:
            stats.stopped = "cancelled"
            break
        t_forward = time.perf_counter()
        logits = target.forward([seq[-1]] + (draft.tokens if draft else []))
        stats.target_forwards += 1
        new = sampler.verify(logits, draft)  # accepted draft tokens + one token of the target's own
        target.crop_to(len(seq) + len(new) - 1)  # rejected draft tokens leave the cache
        policy.observe(draft, len(new) - 1, time.perf_counter() - t_forward)
        seq.extend(new)
        if stats.target_forwards == 1:
            stats.first_token_ms = (time.perf_counter() - started) * 1000
        stats.stopped = finish.check(seq[prompt_len:])
        if stats.stopped:
            break
    return seq[prompt_len:]
