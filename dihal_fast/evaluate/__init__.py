"""Evaluation of hybrids against their backbones: scoring with an evaluator LM, generation, the
evaluation harness, score/loss correlations and report formatting (the Diffusion-LM-like control is in
:mod:`dihal_fast.controls`).

The metrics (pure functions) and the float64 sampler live in the leaf modules
:mod:`dihal_fast.common.metrics` and :mod:`dihal_fast.common.sampling`, which the models use too (the
names below are re-exported from there). The stages that run this (evaluate, sweep, demo) are in
:mod:`dihal_fast.pipeline`.
"""

from dihal_fast.common.metrics import (
    PROTOCOL,
    distinct_n,
    diversity_dihal,
    diversity_ld4lg,
    mean_unigram_entropy,
    perplexity,
    pooled_nll,
    token_kl,
    token_nll,
    tokens_per_second,
    unigram_entropy,
)
from dihal_fast.common.sampling import sample_categorical

__all__ = [
    "PROTOCOL",
    "distinct_n",
    "diversity_dihal",
    "diversity_ld4lg",
    "mean_unigram_entropy",
    "perplexity",
    "pooled_nll",
    "sample_categorical",
    "token_kl",
    "token_nll",
    "tokens_per_second",
    "unigram_entropy",
]
