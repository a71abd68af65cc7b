"""Unigram and add-k bigram perplexity baselines on token-id streams.

Both are fitted on a training stream and scored on the tokens ``eval_ids[1:]`` - exactly the tokens the
language model predicts when it reads ``eval_ids`` (see :func:`dihal_fast.backbone.perplexity.stream_nll`).
"""

from __future__ import annotations

import math

import numpy as np

from dihal_fast.errors import DihalValueError

BIGRAM_K_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)


def _check(train_ids: np.ndarray, eval_ids: np.ndarray, vocab_size: int, k: float) -> None:
    if len(train_ids) < 2 or len(eval_ids) < 2:
        raise DihalValueError(f"need at least 2 tokens to fit and to score, got {len(train_ids)} and {len(eval_ids)}")
    if k <= 0:
        raise DihalValueError(f"smoothing k must be > 0, got {k}")
    top = max(int(train_ids.max()), int(eval_ids.max()))
    if top >= vocab_size or min(int(train_ids.min()), int(eval_ids.min())) < 0:
        raise DihalValueError(f"token ids must lie in [0, {vocab_size}), found {top}")


def unigram_perplexity(train_ids: np.ndarray, eval_ids: np.ndarray, vocab_size: int, k: float = 1.0) -> float:
    """PPL of ``eval_ids[1:]`` under ``p(w) = (c(w) + k) / (N + k V)`` with counts ``c`` from ``train_ids``."""
    _check(train_ids, eval_ids, vocab_size, k)
    counts = np.bincount(train_ids, minlength=vocab_size).astype(np.float64)
    logp = np.log(counts + k) - math.log(len(train_ids) + k * vocab_size)
    return float(np.exp(-logp[eval_ids[1:]].mean()))


def bigram_perplexity(train_ids: np.ndarray, eval_ids: np.ndarray, vocab_size: int, k: float) -> float:
    """PPL of ``eval_ids[1:]`` under ``p(w | v) = (c(v, w) + k) / (c(v) + k V)``, counts from ``train_ids``.

    Pair counts are kept sparse (sorted pair codes ``v * V + w``), so memory grows with the training
    stream, not with ``V^2``.
    """
    _check(train_ids, eval_ids, vocab_size, k)
    train = train_ids.astype(np.int64)
    codes, pair_counts = np.unique(train[:-1] * vocab_size + train[1:], return_counts=True)
    context_counts = np.bincount(train[:-1], minlength=vocab_size).astype(np.float64)
    ev = eval_ids.astype(np.int64)
    query = ev[:-1] * vocab_size + ev[1:]
    pos = np.minimum(np.searchsorted(codes, query), len(codes) - 1)
    c_pair = np.where(codes[pos] == query, pair_counts[pos], 0).astype(np.float64)
    logp = np.log(c_pair + k) - np.log(context_counts[ev[:-1]] + k * vocab_size)
    return float(np.exp(-logp.mean()))


def best_bigram_perplexity(
    train_ids: np.ndarray, eval_ids: np.ndarray, vocab_size: int, grid: tuple[float, ...] = BIGRAM_K_GRID
) -> tuple[float, float]:
    """Lowest bigram PPL over the smoothing grid, and its k (tuned on the scored tokens: favours the baseline)."""
    return min((bigram_perplexity(train_ids, eval_ids, vocab_size, k), k) for k in grid)
