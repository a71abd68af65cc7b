"""Metric functions against hand-computed values and plain Python references."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dihal_fast.common import metrics
from dihal_fast.common.sampling import sample_categorical


def _two_step_logits() -> torch.Tensor:
    # position 0: p = [0.5, 0.5]; position 1: p = [0.75, 0.25]; position 2 is never scored
    return torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [5.0, -5.0]]])


def test_token_nll_hand_computed():
    ids = torch.tensor([[1, 0, 1]])
    sums, counts = metrics.token_nll(_two_step_logits(), ids)
    # -log 0.5 (target 0 at position 1) - log 0.25 (target 1 at position 2) = 3 log 2
    assert counts.tolist() == [2]
    assert sums.item() == pytest.approx(3 * math.log(2), abs=1e-6)
    assert metrics.pooled_nll(sums, counts) == pytest.approx(1.5 * math.log(2), abs=1e-6)
    assert metrics.perplexity(1.5 * math.log(2)) == pytest.approx(2**1.5)


def test_token_nll_masks_padding_on_either_side():
    ids = torch.tensor([[1, 0, 1]])
    right, n_right = metrics.token_nll(_two_step_logits(), ids, torch.tensor([[1, 1, 0]]))
    assert n_right.item() == 1 and right.item() == pytest.approx(math.log(2), abs=1e-6)
    # left padding: the first real token (position 1) has no real predecessor, so only position 2 counts
    left, n_left = metrics.token_nll(_two_step_logits(), ids, torch.tensor([[0, 1, 1]]))
    assert n_left.item() == 1 and left.item() == pytest.approx(math.log(4), abs=1e-6)


def test_pooled_nll_is_token_pooled_not_mean_of_means():
    # sequence A: 1 token with NLL 1, sequence B: 3 tokens with NLL 3 in total -> pooled 4/4 = 1, not (1 + 1)/2
    assert metrics.pooled_nll(torch.tensor([1.0, 3.0]), torch.tensor([1, 3])) == pytest.approx(1.0)
    assert metrics.pooled_nll(torch.tensor([2.0, 3.0]), torch.tensor([1, 3])) == pytest.approx(5 / 4)
    with pytest.raises(ValueError, match="no tokens"):
        metrics.pooled_nll(torch.tensor([0.0]), torch.tensor([0]))


def test_token_kl_hand_computed():
    p = torch.tensor([[[0.0, 0.0], [0.0, 0.0]]])
    q = torch.tensor([[[math.log(3.0), 0.0], [9.0, 9.0]]])
    sums, counts = metrics.token_kl(p, q)
    # KL([.5,.5] || [.75,.25]) = 0.5 log(4/3); only position 0 predicts a scored target
    assert counts.tolist() == [1]
    assert sums.item() == pytest.approx(0.5 * math.log(4 / 3), abs=1e-6)


@given(st.integers(1, 3), st.integers(2, 6), st.integers(2, 5), st.integers(0, 2**31 - 1))
def test_token_nll_and_kl_match_python_reference(batch, length, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, length, vocab, generator=gen, dtype=torch.float64) * 3
    other = torch.randn(batch, length, vocab, generator=gen, dtype=torch.float64) * 3
    ids = torch.randint(0, vocab, (batch, length), generator=gen)
    mask = (torch.rand(batch, length, generator=gen) > 0.3).long()
    sums, counts = metrics.token_nll(logits, ids, mask)
    kl_sums, kl_counts = metrics.token_kl(logits, other, mask)
    for b in range(batch):
        want, want_kl, n = 0.0, 0.0, 0
        for i in range(1, length):
            if mask[b, i] and mask[b, i - 1]:
                row = logits[b, i - 1].tolist()
                log_z = math.log(sum(math.exp(v) for v in row))
                want += log_z - row[ids[b, i]]
                p = [math.exp(v - log_z) for v in row]
                q_row = other[b, i - 1].tolist()
                log_zq = math.log(sum(math.exp(v) for v in q_row))
                want_kl += sum(pk * (math.log(pk) - (qv - log_zq)) for pk, qv in zip(p, q_row))
                n += 1
        assert counts[b].item() == n and kl_counts[b].item() == n
        assert sums[b].item() == pytest.approx(want, rel=1e-5, abs=1e-5)
        assert kl_sums[b].item() == pytest.approx(want_kl, rel=1e-4, abs=1e-5)
        assert kl_sums[b].item() >= -1e-6


def test_kl_of_a_model_with_itself_is_zero():
    logits = torch.randn(2, 5, 7)
    assert metrics.token_kl(logits, logits)[0].abs().max().item() < 1e-6


def test_shape_errors_are_clear():
    with pytest.raises(ValueError, match=r"\[B, T, V\]"):
        metrics.token_nll(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="one shape"):
        metrics.token_kl(torch.zeros(1, 3, 4), torch.zeros(1, 3, 5))


def test_unigram_entropy_hand_computed():
    assert metrics.unigram_entropy([1, 1, 2, 2]) == pytest.approx(math.log(2))
    assert metrics.unigram_entropy([5]) == 0.0
    assert metrics.unigram_entropy([1, 2, 3, 4]) == pytest.approx(math.log(4))
    # per-sample, then averaged: (log 2 + 0) / 2, not the entropy of the pooled tokens
    assert metrics.mean_unigram_entropy([[1, 2], [3, 3]]) == pytest.approx(math.log(2) / 2)
    with pytest.raises(ValueError, match="empty"):
        metrics.unigram_entropy([])


def test_diversity_hand_computed():
    samples = [[1, 2, 1, 2]]
    # distinct-1 = 2/4, distinct-2 = 2/3 ((1,2),(2,1),(1,2)), distinct-3 = 2/2, distinct-4 = 1/1
    assert metrics.distinct_n(samples, 1) == pytest.approx(0.5)
    assert metrics.distinct_n(samples, 2) == pytest.approx(2 / 3)
    assert metrics.diversity_dihal(samples) == pytest.approx(1 / 3)
    assert metrics.diversity_ld4lg(samples) == pytest.approx(2 / 3)
    # n-grams are pooled over samples: a repeated sample halves every ratio
    assert metrics.diversity_ld4lg([[1, 2, 3, 4], [1, 2, 3, 4]]) == pytest.approx(0.5**3)
    with pytest.raises(ValueError, match="no 4-grams"):
        metrics.diversity_dihal([[1, 2, 3]])


@given(st.lists(st.lists(st.integers(0, 5), min_size=4, max_size=12), min_size=1, max_size=5))
def test_diversity_is_a_product_of_ratios_in_unit_interval(samples):
    dihal, ld4lg = metrics.diversity_dihal(samples), metrics.diversity_ld4lg(samples)
    assert 0 < dihal <= ld4lg <= 1
    assert dihal == pytest.approx(ld4lg * metrics.distinct_n(samples, 1))


def test_tokens_per_second():
    assert metrics.tokens_per_second(100, 2.0) == 50.0
    with pytest.raises(ValueError, match="positive"):
        metrics.tokens_per_second(10, 0.0)


def test_sampling_matches_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    logits = probs.log().expand(40000, 4)
    draws = sample_categorical(logits, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=4).double() / draws.numel()
    chi2 = float((((freq - probs) ** 2) / probs).sum() * draws.numel())
    assert chi2 < 16.27  # chi-square, 3 dof, p = 0.001


def test_sampling_temperature_top_k_and_seed():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(2000, 4)
    assert sample_categorical(logits, temperature=0).eq(0).all()
    top2 = sample_categorical(logits, top_k=2, generator=torch.Generator().manual_seed(1))
    assert set(top2.tolist()) == {0, 1}
    a = sample_categorical(logits, generator=torch.Generator().manual_seed(3))
    b = sample_categorical(logits, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    hot = sample_categorical(logits, temperature=0.25, generator=torch.Generator().manual_seed(3))
    assert (hot == 0).float().mean() > (a == 0).float().mean()
    with pytest.raises(ValueError, match="temperature"):
        sample_categorical(logits, temperature=-1)


def test_sampling_draws_float64_uniforms():
    # float32 uniforms cap the Gumbel noise near 16.6 and never reach tokens ~20 nats below the top;
    # the draw must equal Gumbel-max with float64 uniforms from the same generator state
    logits = torch.randn(64, 9, dtype=torch.float32)
    got = sample_categorical(logits, temperature=0.7, generator=torch.Generator().manual_seed(5))
    uniform = torch.rand(64, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    log_probs = torch.log_softmax(logits.double() / 0.7, dim=-1)
    want = (log_probs - torch.log(-torch.log(uniform))).argmax(dim=-1)
    assert torch.equal(got, want)
