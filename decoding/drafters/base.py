"""One small interface for every drafter: propose up to k tokens, then hear how many were accepted."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Draft:
    tokens: list[int]
    source: str  # the drafter's name, for stats and the cost model
    probs: Any = None  # [len(tokens), vocab] draft distribution (model drafter); None = deterministic
    key: str = ""  # acceptance-statistics bucket within the drafter (e.g. "lookup:n4")
    cost_s: float = 0.0  # time already spent producing it (the model drafter)

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class DraftContext:
    """What a drafter may look at for one request."""

    prompt_ids: list[int]
    prefix: str
    suffix: str
    document: str
    sampling: Any = None  # decoding.sampling.Sampler (the model drafter warps its logits the same way)
    cancel: Any = None  # decoding.api.CancelToken: a drafter that runs a model checks it between chunks
    extra: dict = field(default_factory=dict)


class Drafter:
    name = "base"

    def begin(self, ctx: DraftContext) -> None:
        """A new request starts; seq = ctx.prompt_ids."""

    def available(self, seq: list[int]) -> int:
        """How many tokens this drafter could propose right now without spending model time."""
        return 0

    def propose(self, seq: list[int], k: int) -> Draft | None:
        """Up to k tokens that should follow seq (prompt + generated so far)."""
        raise NotImplementedError

    def end(self, failed: bool = False) -> None:
        """The request finished, was cancelled, or failed (then caches may be inconsistent)."""
