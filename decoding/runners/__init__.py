"""Runners: a loaded model plus its live KV cache, behind one contract (decoding/runners/base.py).

- static.py: the quantized formats (int8, int4) on the static-shape forward, exact at every width;
- hf.py: transformers' forward for the float formats and unknown architectures;
- llamacpp.py: the gguf format on llama.cpp.
exactness.py measures, for whichever runs, how wide a verify forward may be and stay lossless.
"""
from __future__ import annotations

from decoding.runners.base import PREFILL_CHUNK, Cancelled, synthetic_tokens

__all__ = ["PREFILL_CHUNK", "Cancelled", "runner_for", "synthetic_tokens"]


def runner_for(loaded, cache_budget_bytes: int, role: str = "target", probe: bool = True):
    """The runner for a loaded model, its verify exactness measured (cached across starts) unless
    `probe` is False (timing runs that never draft)."""
    from decoding.runners import exactness

    if loaded.weights == "gguf":
        from decoding.runners.llamacpp import LlamaCppRunner

        runner = LlamaCppRunner(loaded, cache_budget_bytes, role)
    elif getattr(loaded.model, "static_forward", False):
        from decoding.runners.static import StaticRunner

        runner = StaticRunner(loaded, cache_budget_bytes, role)
    else:
        from decoding.runners.hf import ModelRunner

        runner = ModelRunner(loaded, cache_budget_bytes, role)
    if probe and role != "draft":  # a draft model's forwards only propose: the target verifies
        exactness.measure(runner)
    return runner
