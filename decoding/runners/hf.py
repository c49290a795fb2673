"""The target on transformers' own forward and a DynamicCache: the float formats (fp32, bf16, fp16),
and models the static forward does not know (decoding/models/static_decoder.py)."""
from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

from decoding.api import CancelToken
from decoding.kv_cache import KVStore
from decoding.models.checkpoint import LoadedModel
from decoding.runners.base import Runner


def kv_bytes_per_token(model) -> int:
    cfg = model.config
    text_cfg = getattr(cfg, "text_config", cfg)
    heads = getattr(text_cfg, "num_key_value_heads", None) or text_cfg.num_attention_heads
    head_dim = getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // text_cfg.num_attention_heads
    elem = next(model.parameters()).element_size()
    return 2 * text_cfg.num_hidden_layers * heads * head_dim * elem


class ModelRunner(Runner):
    """Each request takes a DynamicCache from the store and hands it back when done."""

    path = "eager"
    # A DynamicCache has no end: the exactness probe's "near the end" position is taken here, past the
    # default prompt budget, where reading a real prompt up to it stays affordable at load.
    max_positions = 1024

    def __init__(self, loaded: LoadedModel, cache_budget_bytes: int, role: str = "target"):
        self._init_bookkeeping(role, loaded)
        self.model = loaded.model
        self.store = KVStore(kv_bytes_per_token(self.model), cache_budget_bytes)
        self.vocab_size = self.model.config.get_text_config().vocab_size
        # transformers 5.x renamed past_key_values to cache; accept either release.
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.cache: DynamicCache | None = None

    def start(self, ids: list[int], document: str, cancel: CancelToken | None = None) -> int:
        """Take the best stored cache for this prompt; returns how many prompt tokens it covers."""
        self.document = document
        self.cancel, self.forwards_after_cancel = cancel, 0
        got = self.store.take(ids, document)
        if got is None:
            self.cache, self.tokens = DynamicCache(config=self.model.config), []
        else:
            self.cache, self.tokens = got
        return len(self.tokens)

    def finish(self) -> None:
        """Hand the cache back to the store for later requests."""
        if self.cache is not None:
            self.store.put(self.cache, self.tokens, self.document)
        self.cache, self.tokens = None, []

    def discard(self) -> None:
        """Drop the cache: after an error mid-forward its layers may not match self.tokens."""
        self.cache, self.tokens = None, []

    def crop_to(self, n: int) -> None:
        if n < len(self.tokens):
            self.cache.crop(n - len(self.tokens))
            del self.tokens[n:]

    @torch.inference_mode()
    def forward(self, ids: list[int], logits_to_keep: int | None = None) -> torch.Tensor:
        """Append ids to the cache; return float logits [n, V] for the last n positions."""
        keep = len(ids) if logits_to_keep is None else logits_to_keep
        inp = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=inp, use_cache=True, logits_to_keep=keep, **{self._cache_kw: self.cache})
        self.tokens.extend(ids)
        self._counted()
        return out.logits[0].float()
