"""Turning target logits into tokens, and deciding which drafted tokens the target accepts.

Greedy: accept the longest draft prefix equal to the target's argmax, then the target's own token —
identical to plain greedy decoding. Sampling: speculative rejection sampling (accept x with
min(1, p(x)/q(x)), else resample from max(p - q, 0)), which preserves the target's distribution; a
deterministic draft (lookup, suggestion) is a point mass q, which reduces to sample-and-compare.
"""
from __future__ import annotations

import torch

from decoding.drafters.base import Draft


class Sampler:
    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None):
        self.greedy = temperature <= 0.0
        self.warpers = []
        if not self.greedy:
            # transformers' own warpers, imported only when sampling: a greedy start never loads it
            from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

            self.warpers.append(TemperatureLogitsWarper(temperature))
            if top_k and top_k > 0:
                self.warpers.append(TopKLogitsWarper(top_k))
            if top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(top_p))
        # A private generator: the process-wide RNG belongs to whoever else runs in this process.
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)
        else:
            self.generator.seed()  # fresh entropy for this generator only

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[n, V] logits -> [n, V] probabilities after temperature / top-k / top-p."""
        logits = logits.float()
        for warper in self.warpers:
            logits = warper(None, logits)
        warped = logits
        return torch.softmax(warped, dim=-1)

    def pick(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """One token from [V] logits (the model drafter); returns (token, probs or None when greedy)."""
        if self.greedy:
            return int(logits.argmax()), None
        p = self.probs(logits[None])[0]
        return int(torch.multinomial(p, 1, generator=self.generator)), p

    def _uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))

    def verify(self, logits: torch.Tensor, draft: Draft | None) -> list[int]:
        """logits: [k+1, V] for [last token] + draft. Returns accepted draft tokens + one target token."""
        tokens = draft.tokens if draft else []
        if self.greedy:
            preds = logits.argmax(dim=-1).tolist()
            n = 0
            while n < len(tokens) and tokens[n] == preds[n]:
                n += 1
            return tokens[:n] + [preds[n]]
        p = self.probs(logits)
        q_all = draft.probs if draft is not None else None
        if q_all is not None and q_all.shape[-1] != p.shape[-1]:
            # Same tokenizer, differently padded embedding tables (e.g. Qwen 0.5B vs 7B): align them.
            v = p.shape[-1]
            q_all = q_all[:, :v] if q_all.shape[-1] > v else torch.nn.functional.pad(q_all, (0, v - q_all.shape[-1]))
        for i, x in enumerate(tokens):
            q = q_all[i] if q_all is not None else None
            q_x = float(q[x]) if q is not None else 1.0
            if self._uniform() * q_x < float(p[i, x]):  # accept with probability min(1, p/q)
                continue
            residual = (p[i] - q).clamp_min(0) if q is not None else p[i].clone()
            if q is None:
                residual[x] = 0.0
            total = float(residual.sum())
            if total <= 0:  # p == q up to rounding: any sample from p is right
                residual, total = p[i], 1.0
            return tokens[:i] + [int(torch.multinomial(residual / total, 1, generator=self.generator))]
        return tokens + [int(torch.multinomial(p[len(tokens)], 1, generator=self.generator))]
