"""A model plus the KV cache of the sequence it is working on.

Invariant between calls: `self.tokens` lists exactly the tokens whose keys/values are in the cache.
"""
from __future__ import annotations

import inspect
import os
import time

import torch
from transformers import DynamicCache

from decoding.api import CancelToken
from decoding.kv_cache import KVStore, common_prefix_len
from decoding.models.loading import LoadedModel

PREFILL_CHUNK = 512  # tokens per prefill forward: bounds the wait for a cancel during long prefills;
# each chunk re-reads all weights, so smaller chunks make every cold prompt slower on a CPU


def kv_bytes_per_token(model) -> int:
    cfg = model.config
    text_cfg = getattr(cfg, "text_config", cfg)
    heads = getattr(text_cfg, "num_key_value_heads", None) or text_cfg.num_attention_heads
    head_dim = getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // text_cfg.num_attention_heads
    elem = next(model.parameters()).element_size()
    return 2 * text_cfg.num_hidden_layers * heads * head_dim * elem


class Cancelled(Exception):
    pass


def synthetic_tokens(vocab_size: int, n: int) -> list[int]:
    """n ordinary token ids to time or probe forwards with (their values do not change the cost)."""
    return [(i * 7919) % min(vocab_size - 20, 1000) + 10 for i in range(n)]


class PrefixSync:
    """What every runner (PyTorch's below, llama.cpp's) does the same way on top of its own `tokens`,
    `crop_to` and `forward`."""

    # Prompt tokens a request leaves for its first verify forward (sync's `unread`): on PyTorch only
    # the last. A bf16 row's result depends on how many rows its forward has, so plain and drafted
    # decoding must read the prompt alike: all of it but the last token first.
    prompt_tail = 1

    def sync(self, seq: list[int], cancel: CancelToken | None = None, unread: int = 1) -> int:
        """Make the cache hold seq but its last token (crop where it diverges, feed what is missing),
        or, with `unread` > 1, leave up to that many of the missing tokens at its end unread for the
        caller's next forward. Returns tokens fed."""
        keep = min(common_prefix_len(self.tokens, seq), len(seq) - 1)
        self.crop_to(keep)
        missing = seq[keep:len(seq) - max(1, min(unread, len(seq) - keep))]
        for i in range(0, len(missing), PREFILL_CHUNK):
            if cancel is not None and cancel.cancelled:
                raise Cancelled()
            self.forward(missing[i:i + PREFILL_CHUNK], logits_to_keep=1)
        return len(missing)


class ModelRunner(PrefixSync):
    # PyTorch formats verify with the kernels whose row-exactness README "Weights" documents per format
    verify_exact = True

    def __init__(self, loaded: LoadedModel, cache_budget_bytes: int, role: str = "target"):
        self.role = role
        self.loaded = loaded
        self.model = loaded.model
        self.device = loaded.device
        self.store = KVStore(kv_bytes_per_token(self.model), cache_budget_bytes)
        self.vocab_size = self.model.config.get_text_config().vocab_size
        # transformers 5.x renamed past_key_values to cache; accept either release.
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.cache: DynamicCache | None = None
        self.tokens: list[int] = []
        self.document = ""
        self.forwards = 0  # lifetime count, read by tests and stats
        self.cancel: CancelToken | None = None  # the running request's, set by start()
        self.forwards_after_cancel = 0  # this request's forwards that finished after its cancel
        # Test-only switch: make each forward slow enough to cancel mid-generation with a tiny model.
        self.test_delay_s = float(os.environ.get("DRAFTWISE_TEST_FORWARD_DELAY_MS", "0") or 0) / 1000.0

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
        self.forwards += 1
        if self.test_delay_s:
            time.sleep(self.test_delay_s)
        if self.cancel is not None and self.cancel.cancelled:
            self.forwards_after_cancel += 1  # what a cancel costs: the forward already in flight
        return out.logits[0].float()



def runner_for(loaded: LoadedModel, cache_budget_bytes: int, role: str = "target"):
    """The runner for a loaded model: llama.cpp's for the gguf format, else PyTorch's."""
    if loaded.weights == "gguf":
        from decoding.llamacpp_runner import LlamaCppRunner

        return LlamaCppRunner(loaded, cache_budget_bytes, role)
    return ModelRunner(loaded, cache_budget_bytes, role)


def read_ahead(runner: ModelRunner, ids: list[int], document: str, cancel: CancelToken) -> int:
    """Idle work: extend the stored cache for `document` to hold ids[:-1], as the request that will
    send these ids needs it. A cancel stops it between chunks and keeps what was read. Returns the
    tokens read."""
    reused = runner.start(ids, document, cancel)
    try:
        runner.sync(ids, cancel)
    except Cancelled:
        pass
    except BaseException:
        runner.discard()
        raise
    read = len(runner.tokens) - reused
    runner.finish()
    return read
