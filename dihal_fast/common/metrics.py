"""Pure metric functions: likelihood, divergence, entropy, diversity and throughput.

Conventions (named in every report through :data:`PROTOCOL`):

* Teacher-forced NLL is token-pooled: the sum of ``-log p(x_i | x_<i)`` over every scored token
  divided by the number of scored tokens (not a mean of per-sequence means). The first token of
  each sequence has no context and is not scored; a token is scored only when it and its
  predecessor are both real (attention mask 1), so padding on either side is excluded.
* KL is ``KL(backbone || hybrid)`` of the next-token distributions at the same positions NLL scores,
  averaged over those positions, in nats.
* Entropy is the per-sample unigram entropy (nats) of a sample's token ids, averaged over samples.
* Diversity: DiHAL uses the product of distinct-1..4, LD4LG the product over n = 2..4; both ratios
  are unique / total n-grams pooled over all samples.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from dihal_fast.errors import DihalValueError

PROTOCOL = {
    "nll": "token-pooled teacher-forced NLL in nats; first token of each sequence unscored; "
    "a token is scored when it and its predecessor are unpadded",
    "ppl": "exp(token-pooled NLL)",
    "stream_nll": "backbone reports only: token-pooled NLL in nats over a token stream cut into windows of "
    "seq_len + 1 tokens that share one token, so every token after the first is scored once (as the unigram "
    "and bigram baselines score them)",
    "kl": "mean over scored positions of KL(backbone || hybrid) of next-token distributions, nats",
    "entropy": "per-sample unigram entropy of the sample's evaluator token ids (nats), mean over samples",
    "diversity_dihal": "product over n=1..4 of distinct-n (unique/total n-grams pooled over samples)",
    "diversity_ld4lg": "product over n=2..4 of unique/total n-grams pooled over samples",
}


def scored_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``BoolTensor[B, T-1]``: which targets ``x_1..x_{T-1}`` are scored (token and predecessor real)."""
    mask = attention_mask.bool()
    return mask[:, 1:] & mask[:, :-1]


def _check_logits(logits: torch.Tensor, input_ids: torch.Tensor) -> None:
    if logits.dim() != 3 or input_ids.dim() != 2 or logits.shape[:2] != input_ids.shape:
        raise DihalValueError(
            f"expected logits [B, T, V] and input_ids [B, T] with the same B, T; "
            f"got {tuple(logits.shape)} and {tuple(input_ids.shape)}"
        )


def token_nll(
    logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence summed NLL (float64 ``[B]``) and number of scored tokens (int64 ``[B]``).

    ``logits[b, i]`` predicts ``input_ids[b, i + 1]``. Pool with :func:`pooled_nll`.
    """
    _check_logits(logits, input_ids)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    mask = scored_mask(attention_mask)
    return target_nll(logits[:, :-1], input_ids[:, 1:], mask).sum(dim=1), mask.sum(dim=1)


def target_nll(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``-log softmax(logits)[target]`` per position (float64 ``[B, T]``, float32 softmax), 0 where ``mask`` is
    false: the one cross-entropy of both perplexity protocols."""
    losses = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none").to(torch.float64)
    return losses * mask


def pooled_nll(nll_sum: float | torch.Tensor, n_tokens: int | torch.Tensor) -> float:
    """Token-pooled NLL ``sum / count`` (nats per token); raises when nothing was scored."""
    total = float(torch.as_tensor(nll_sum, dtype=torch.float64).sum())
    count = int(torch.as_tensor(n_tokens).sum())
    if count <= 0:
        raise DihalValueError("no tokens were scored (every sequence shorter than 2 real tokens?)")
    return total / count


def perplexity(nll: float) -> float:
    """``exp(nll)``; ``inf`` on overflow rather than an exception."""
    try:
        return math.exp(nll)
    except OverflowError:
        return math.inf


def token_kl(
    reference_logits: torch.Tensor, logits: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence summed ``KL(reference || model)`` (float64 ``[B]``) over NLL's scored positions
    and their count (int64 ``[B]``). Both logits are ``[B, T, V]`` over the same vocabulary."""
    if reference_logits.shape != logits.shape or logits.dim() != 3:
        raise DihalValueError(
            f"reference and model logits must both be [B, T, V] of one shape, got "
            f"{tuple(reference_logits.shape)} and {tuple(logits.shape)}"
        )
    if attention_mask is None:
        attention_mask = torch.ones(logits.shape[:2], dtype=torch.long, device=logits.device)
    mask = scored_mask(attention_mask)
    log_p = torch.log_softmax(reference_logits[:, :-1].float(), dim=-1)
    log_q = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(dim=-1).to(torch.float64)
    return (kl * mask).sum(dim=1), mask.sum(dim=1)


def unigram_entropy(tokens: Sequence[int]) -> float:
    """Entropy (nats) of the empirical unigram distribution of one sample's tokens."""
    if len(tokens) == 0:
        raise DihalValueError("cannot compute the entropy of an empty sample")
    counts = torch.tensor(list(Counter(tokens).values()), dtype=torch.float64)
    probs = counts / counts.sum()
    return float(-(probs * probs.log()).sum())


def mean_unigram_entropy(samples: Sequence[Sequence[int]]) -> float:
    """Per-sample unigram entropy averaged over samples (empty samples are an error)."""
    if not samples:
        raise DihalValueError("no samples given")
    return sum(unigram_entropy(sample) for sample in samples) / len(samples)


def distinct_n(samples: Sequence[Sequence], n: int) -> float:
    """Unique / total n-grams pooled over all samples (distinct-n). Raises when there are none."""
    if n < 1:
        raise DihalValueError(f"n must be >= 1, got {n}")
    grams = [tuple(sample[i : i + n]) for sample in samples for i in range(len(sample) - n + 1)]
    if not grams:
        raise DihalValueError(f"the samples contain no {n}-grams (every sample shorter than {n} tokens)")
    return len(set(grams)) / len(grams)


def diversity_dihal(samples: Sequence[Sequence]) -> float:
    """DiHAL's diversity: the product of distinct-1, distinct-2, distinct-3 and distinct-4."""
    return math.prod(distinct_n(samples, n) for n in range(1, 5))


def diversity_ld4lg(samples: Sequence[Sequence]) -> float:
    """LD4LG's diversity: the product over n = 2..4 of unique / total n-grams."""
    return math.prod(distinct_n(samples, n) for n in range(2, 5))


def tokens_per_second(n_tokens: int, seconds: float) -> float:
    """Generation throughput; raises for a non-positive duration instead of returning inf."""
    if seconds <= 0:
        raise DihalValueError(f"duration must be positive, got {seconds} s")
    return n_tokens / seconds
