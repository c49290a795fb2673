"""Drafting with a small model that shares the target's tokenizer (e.g. a 0.5B for a 1.5B/7B target).

It keeps its own KV cache (reused across requests like the target's) and stops drafting as soon as
its own top-1 probability falls under a threshold: a token it is unsure of is probably rejected, and
on a CPU every drafted token costs real time.
"""
from __future__ import annotations

import time

import torch

from decoding.drafters.base import Draft, DraftContext, Drafter, Offer
from decoding.healing import limited
from decoding.runners.base import Runner


class ModelDrafter(Drafter):
    name = "model"

    def __init__(self, runner: Runner, step_s: float, prefill_s: float, confidence: float = 0.4):
        self.runner = runner
        self.step_s = step_s  # one drafted token, kept current from the drafts it makes
        self.prefill_s = prefill_s  # one prompt token read in a chunk, measured at load
        self.confidence = confidence
        self.sampler = None
        self.cancel = None
        self.active = False
        self.prompt_len, self.healing = 0, None

    def begin(self, ctx: DraftContext) -> None:
        self.sampler = ctx.sampling
        self.cancel = ctx.cancel
        self.prompt_len, self.healing = len(ctx.prompt_ids), ctx.healing
        self.runner.start(ctx.prompt_ids, ctx.document)
        self.active = True

    def catch_up_tokens(self, seq: list[int]) -> int:
        """How many tokens the draft cache would have to prefill before drafting."""
        from decoding.kv_cache import common_prefix_len

        return max(0, len(seq) - 1 - common_prefix_len(self.runner.tokens, seq))

    def offer(self, seq: list[int], room: int) -> Offer | None:
        # A model can always draft; the cost model decides how much, and whether reading what the
        # cache lacks first (on a cold request the whole prompt) pays over the rest of the request.
        if room <= 0:
            return None
        return Offer(room, "model", self.step_s, self.catch_up_tokens(seq) * self.prefill_s)

    def observe_step(self, seconds: float, weight: float = 0.1) -> None:
        self.step_s = (1 - weight) * self.step_s + weight * seconds

    @torch.inference_mode()
    def propose(self, seq: list[int], k: int) -> Draft | None:
        if k <= 0:
            return None
        self.runner.sync(seq, self.cancel)  # catch up on what the cache lacks (Cancelled between chunks)
        t0 = time.perf_counter()  # the drafting steps; the catch-up above is costed apart
        tokens: list[int] = []
        probs = []
        last = seq[-1]
        for _ in range(k):
            logits = self.runner.forward([last])[-1]
            allowed = self.healing.allowed(seq[self.prompt_len:] + tokens) if self.healing is not None else None
            if allowed is not None:
                logits = limited(logits, allowed)  # as the target's first tokens are
            if self.sampler.greedy:
                p_top = torch.softmax(logits, -1).max()
                if tokens and float(p_top) < self.confidence:
                    break
                tok = int(logits.argmax())
            else:
                tok, p = self.sampler.pick(logits)
                if tokens and float(p.max()) < self.confidence:
                    break
                probs.append(p)
            tokens.append(tok)
            last = tok
        self.observe_step((time.perf_counter() - t0) / len(tokens))
        stacked = torch.stack(probs) if probs else None
        return Draft(tokens, self.name, probs=stacked, key="model")

    def end(self, failed: bool = False) -> None:
        if not self.active:
            return
        if failed:
            self.runner.discard()
        else:
            self.runner.finish()
        self.active = False

    def clear(self) -> None:
        self.runner.store.clear()

    def prepare(self, prompt_ids: list[int], document: str, cancel) -> int:
        return self.runner.read_ahead(prompt_ids, document, cancel)
