"""Speculative sampling must reproduce the target's distribution (chi-square on a tiny vocabulary)."""
from __future__ import annotations

import torch

from decoding.drafters.base import Draft
from decoding.sampling import Sampler

V = 6
N = 6000
# Critical value of chi-square with V-1 = 5 degrees of freedom at p = 0.001: a correct sampler fails
# this 1 time in 1000; a wrong one (e.g. always accepting the draft) fails by orders of magnitude.
CHI2_CRIT_5DF = 20.515


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def run(sampler: Sampler, logits: torch.Tensor, q: torch.Tensor | None, deterministic_token: int | None = None):
    first = torch.zeros(V)
    second_given_accept = torch.zeros(V)
    g = torch.Generator().manual_seed(123)
    for _ in range(N):
        if q is not None:
            x = int(torch.multinomial(q[0], 1, generator=g))
            y = int(torch.multinomial(q[1], 1, generator=g))
            draft = Draft([x, y], "model", probs=q)
        else:
            x = y = deterministic_token
            draft = Draft([x, y], "lookup")
        out = sampler.verify(logits, draft)
        first[out[0]] += 1
        if len(out) >= 2 and out[0] == x:
            second_given_accept[out[1]] += 1
    return first, second_given_accept


def test_rejection_sampling_with_draft_probabilities_matches_target():
    torch.manual_seed(0)
    logits = torch.randn(3, V) * 1.5  # target logits for positions 0, 1, 2
    q = torch.softmax(torch.randn(2, V) * 1.5, -1)  # a draft that disagrees with the target
    sampler = Sampler(temperature=1.0, seed=5)
    p = sampler.probs(logits)
    first, second = run(sampler, logits, q)
    assert chi_square(first, p[0]) < CHI2_CRIT_5DF
    assert chi_square(second, p[1]) < CHI2_CRIT_5DF


def test_deterministic_draft_sample_and_compare_matches_target():
    torch.manual_seed(1)
    logits = torch.randn(3, V)
    sampler = Sampler(temperature=0.8, seed=9)
    p = sampler.probs(logits)
    first, second = run(sampler, logits, None, deterministic_token=2)
    assert chi_square(first, p[0]) < CHI2_CRIT_5DF
    assert chi_square(second, p[1]) < CHI2_CRIT_5DF


def test_always_accepting_the_draft_would_fail_the_test():
    """The statistic has power: the draft's own distribution is rejected as the target's."""
    torch.manual_seed(0)
    logits = torch.randn(3, V) * 1.5
    q = torch.softmax(torch.randn(2, V) * 1.5, -1)
    g = torch.Generator().manual_seed(3)
    wrong = torch.bincount(torch.multinomial(q[0], N, replacement=True, generator=g), minlength=V).float()
    assert chi_square(wrong, Sampler(temperature=1.0).probs(logits)[0]) > CHI2_CRIT_5DF


def test_top_k_and_top_p_warp_both_sides():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.5, 0.1, -1.0]] * 3)
    sampler = Sampler(temperature=1.0, top_k=3, top_p=0.95, seed=0)
    p = sampler.probs(logits)
    assert torch.all(p[:, 3:] == 0)  # top-k removed them
    first, _ = run(sampler, logits, None, deterministic_token=4)  # a draft token the target never samples
    assert first[3:].sum() == 0


def test_greedy_verify_accepts_longest_matching_prefix():
    logits = torch.full((4, V), -5.0)
    for pos, tok in enumerate([1, 2, 3, 4]):
        logits[pos, tok] = 5.0
    greedy = Sampler()
    assert greedy.verify(logits, Draft([1, 2, 0], "lookup")) == [1, 2, 3]  # partial: 2 accepted, then target's 3
    assert greedy.verify(logits, Draft([1, 2, 3], "lookup")) == [1, 2, 3, 4]  # all accepted + bonus
    assert greedy.verify(logits, Draft([5, 2, 3], "lookup")) == [1]  # none accepted
    assert greedy.verify(logits[:1], None) == [1]  # plain step


def test_unseeded_samplers_leave_the_global_rng_alone():
    """Sampling draws from the sampler's own generator; an unseeded request must neither reseed nor
    consume torch's process-wide stream (other code in the process relies on it)."""
    logits = torch.randn(3, V)
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    for temperature in (0.0, 0.8):
        sampler = Sampler(temperature=temperature)
        for _ in range(20):
            sampler.verify(logits, Draft([1, 2], "lookup"))
        sampler.pick(logits[0])
    assert torch.equal(torch.rand(4), expected)


def test_unseeded_samplers_differ_and_seeded_ones_repeat():
    logits = torch.zeros(1, 1000)  # uniform over 1000 tokens: equal streams would be a coincidence

    def stream(sampler: Sampler) -> list[int]:
        return [sampler.verify(logits, None)[0] for _ in range(8)]

    assert stream(Sampler(temperature=1.0)) != stream(Sampler(temperature=1.0))
    assert stream(Sampler(temperature=1.0, seed=7)) == stream(Sampler(temperature=1.0, seed=7))
