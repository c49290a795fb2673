"""The Hugging Face built-ins, timed the same way as the engine: plain greedy `generate`,
assisted generation with the draft model, and prompt lookup decoding.

How the time is split (the same rule for every mode of the benchmark): *prefill* feeds the prompt;
*decode* is every later target forward. `generate`'s first forward feeds the whole prompt and also
yields the first token, so here decode is timed from the first token to the last and counts the
tokens after the first one. The first token's time comes from a streamer (called synchronously by
`generate` for each new chunk); forwards and their sizes from hooks on the target model.

Assisted and prompt-lookup generation do not report how many tokens they drafted. Each target
forward after the first feeds the last accepted token plus the candidates, so the candidates per
forward are its new positions minus one (minus the prompt, for the first forward), and every forward
yields its accepted candidates plus one token of its own; drafted/accepted are derived from that.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence


@dataclass
class GenerateTiming:
    token_ids: list[int]  # new tokens, cut after the first end token (which is kept)
    first_chunk_tokens: int  # tokens the first forward produced (more than one for assisted)
    prefill_ms: float  # the first target forward
    first_token_ms: float
    decode_ms: float
    total_ms: float
    forward_positions: list[int] = field(default_factory=list)  # new positions fed per target forward
    prompt_tokens: int = 0

    @property
    def target_forwards_after_first(self) -> int:
        return max(0, len(self.forward_positions) - 1)

    def draft_counts(self, emitted_with_first: int) -> tuple[int, int]:
        """(drafted, accepted) derived from forward sizes; see the module docstring."""
        if not self.forward_positions:
            return 0, 0
        first = max(0, self.forward_positions[0] - self.prompt_tokens)
        drafted = first + sum(max(0, n - 1) for n in self.forward_positions[1:])
        accepted = max(0, min(drafted, emitted_with_first - len(self.forward_positions)))
        return drafted, accepted


def _streamer_class():
    from transformers.generation.streamers import BaseStreamer

    class TokenClock(BaseStreamer):
        """Records when each chunk of new tokens arrives; `generate` first puts the prompt."""

        def __init__(self) -> None:
            self.prompt_seen = False
            self.chunks: list[tuple[float, int]] = []

        def put(self, value) -> None:
            if not self.prompt_seen:
                self.prompt_seen = True
                return
            self.chunks.append((time.perf_counter(), int(value.numel())))

        def end(self) -> None:
            pass

    return TokenClock


class _Healing:
    """The engine's healing constraint as a transformers logits processor (one sequence)."""

    def __init__(self, constraint, prompt_len: int):
        self.constraint, self.prompt_len = constraint, prompt_len

    def __call__(self, input_ids, scores):
        from decoding.healing import limited

        allowed = self.constraint.allowed(input_ids[0, self.prompt_len:].tolist())
        return scores if allowed is None else limited(scores, allowed)


def cut_at_end(ids: Sequence[int], end_ids: set[int]) -> tuple[list[int], bool]:
    """ids up to and including the first end token; whether one was found."""
    out = []
    for t in ids:
        out.append(int(t))
        if t in end_ids:
            return out, True
    return out, False


def generate_timed(model, prompt_ids: Sequence[int], max_new_tokens: int, end_ids: set[int], *,
                   assistant_model=None, prompt_lookup_num_tokens: int | None = None,
                   healing=None) -> GenerateTiming:
    """Greedy `model.generate` on one prompt, with timings. Only one of the two drafting options.
    healing: a decoding.healing.Constraint on the first tokens, as the engine applies it."""
    import torch
    from transformers import GenerationConfig, LogitsProcessorList

    if assistant_model is not None and prompt_lookup_num_tokens:
        raise ValueError("choose assisted generation or prompt lookup, not both")
    ends = sorted(end_ids)
    # A fresh config: the checkpoint's own generation_config may ask for sampling or a
    # repetition penalty, and the baseline must be plain greedy like every other mode.
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, repetition_penalty=1.0,
        eos_token_id=ends, pad_token_id=ends[0], use_cache=True,
        prompt_lookup_num_tokens=prompt_lookup_num_tokens,
    )
    positions: list[int] = []
    forward_times: list[tuple[float, float]] = []

    def before(_module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is None and args:
            ids = args[0]
        positions.append(int(ids.shape[1]) if ids is not None else 0)
        forward_times.append((time.perf_counter(), 0.0))

    def after(_module, _args, _kwargs, _output):
        start, _ = forward_times[-1]
        forward_times[-1] = (start, time.perf_counter())

    clock = _streamer_class()()
    input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=model.device)
    attention_mask = torch.ones_like(input_ids)
    h1 = model.register_forward_pre_hook(before, with_kwargs=True)
    h2 = model.register_forward_hook(after, with_kwargs=True)
    extra = {"assistant_model": assistant_model} if assistant_model is not None else {}
    if healing is not None:
        extra["logits_processor"] = LogitsProcessorList([_Healing(healing, len(prompt_ids))])
    try:
        with torch.inference_mode():
            started = time.perf_counter()
            out = model.generate(input_ids, attention_mask=attention_mask, generation_config=config,
                                 streamer=clock, **extra)
            finished = time.perf_counter()
    finally:
        h1.remove()
        h2.remove()
    new_ids, _ = cut_at_end(out[0, input_ids.shape[1]:].tolist(), end_ids)
    first_t, first_n = clock.chunks[0] if clock.chunks else (finished, 0)
    prefill_ms = (forward_times[0][1] - forward_times[0][0]) * 1000 if forward_times else 0.0
    return GenerateTiming(
        token_ids=new_ids, first_chunk_tokens=min(first_n, len(new_ids)), prefill_ms=prefill_ms,
        first_token_ms=(first_t - started) * 1000, decode_ms=(finished - first_t) * 1000,
        total_ms=(finished - started) * 1000, forward_positions=positions, prompt_tokens=len(prompt_ids),
    )
