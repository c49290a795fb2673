"""The engine's prompt with its end healed (decoding/healing.py), for the hand-written reference
decoders: they decode the same problem as the engine (the prompt without that end, the first tokens
limited to those that write it) with their own loops. The sets of allowed tokens and the masking are
the engine's own (`Constraint.allowed`, `limited`); tests/engine/test_healing.py checks them on their
own."""
from __future__ import annotations

import torch

from decoding.healing import Constraint, limited, without_healed


class HealedPrompt:
    def __init__(self, engine, request):
        parts = engine.models.prompt_parts(request)
        self.ids, self.healed, self.models = parts.ids, parts.healed, engine.models
        self.constraint = Constraint(engine.models.healing, self.healed) if self.healed else None

    def limit(self, logits: torch.Tensor, out: list[int]) -> torch.Tensor:
        """[V] logits of the token after `out`, with the tokens healing rules out at -inf."""
        allowed = self.constraint.allowed(out) if self.constraint is not None else None
        return logits if allowed is None else limited(logits, allowed)

    def text(self, out: list[int]) -> str:
        """The completion's text as the engine reports it (an unfinished UTF-8 character at the end
        is not text yet)."""
        return without_healed(self.healed, self.models.decode(out)).rstrip("\ufffd")


def last_logits(model, ids: list[int]) -> torch.Tensor:
    """[V] float logits after `ids`, from one uncached forward of the whole sequence: a transformers
    model's own forward, or the static decoder's (decoding/models/static_decoder.py) from position 0,
    which overwrites its cache and reads nothing cached."""
    with torch.inference_mode():
        if getattr(model, "static_forward", False):
            return model(torch.tensor(ids), 0, 1)[-1]
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()
