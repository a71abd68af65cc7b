"""Evaluation of hybrids against their backbones: metrics (pure functions), float64 sampling,
scoring with an evaluator LM, generation, the layer sweep and the end-to-end report."""
from dihal_fast.evaluate.metrics import (
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
from dihal_fast.evaluate.sampling import sample_categorical

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
