"""One small interface for every drafter: say what it could draft and at what cost, propose up to k
tokens, then hear that the request ended. The policy prices offers without knowing drafter names."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Draft:
    tokens: list[int]
    source: str  # the drafter's name, for stats and the cost model
    probs: Any = None  # [len(tokens), vocab] draft distribution (model drafter); None = deterministic
    key: str = ""  # acceptance-statistics bucket within the drafter (e.g. "lookup:n4")

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class Offer:
    """What a drafter could draft now, for the cost model to price."""

    tokens: int  # at most this many tokens
    key: str  # the acceptance-statistics bucket the draft would fall in
    step_s: float = 0.0  # model time per drafted token (zero for lookups)
    catch_up_s: float = 0.0  # model time before the first token: reading what its cache lacks


@dataclass
class DraftContext:
    """What a drafter may look at for one request."""

    prompt_ids: list[int]
    prefix: str
    suffix: str
    document: str
    sampling: Any = None  # decoding.sampling.Sampler (the model drafter warps its logits the same way)
    cancel: Any = None  # decoding.api.CancelToken: a drafter that runs a model checks it between chunks
    draft_hint: str = ""  # text the user is probably typing next (CompletionRequest.draft_hint)
    healing: Any = None  # decoding.healing.Constraint: the text the first generated tokens must write
    lookup_texts: tuple[str, ...] = ()  # the repository beyond the prompt (CompletionRequest.lookup_texts)


class Drafter:
    name = "base"

    def begin(self, ctx: DraftContext) -> None:
        """A new request starts; seq = ctx.prompt_ids."""

    def offer(self, seq: list[int], room: int) -> Offer | None:
        """What this drafter could propose after seq, at most `room` tokens; None when nothing."""
        return None

    def propose(self, seq: list[int], k: int) -> Draft | None:
        """Up to k tokens that should follow seq (prompt + generated so far)."""
        raise NotImplementedError

    def end(self, failed: bool = False) -> None:
        """The request finished, was cancelled, or failed (then caches may be inconsistent)."""

    def clear(self) -> None:
        """Forget what is kept across requests (caches); the next request starts cold."""

    def prepare(self, prompt_ids: list[int], document: str, cancel) -> int:
        """Idle time before a request: read what it will need (a model's KV cache). Returns tokens read."""
        return 0
