"""Uncertainty for the HC-DLM tables: the paired bootstrap of a difference between two systems scored on the same
rows (the same examples, or the same training seeds)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dihal_fast.errors import DihalValueError

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> dict[str, float]:
    """``mean(a - b)`` with its percentile interval over ``resamples`` draws of the rows with replacement (row ``i``
    of ``a`` and of ``b`` are drawn together: the pairing removes the rows' shared difficulty from the interval).

    Returns ``{difference, low, high, n, resamples, confidence}``; float64 throughout, one NumPy generator of
    ``seed``, so the same inputs give the same interval."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape or x.size == 0:
        raise DihalValueError(
            f"a paired bootstrap needs two equally long, non-empty rows of values, got {x.shape}, {y.shape}"
        )
    if resamples < 1 or not 0.0 < confidence < 1.0:
        raise DihalValueError(f"resamples must be >= 1 and confidence in (0, 1), got {resamples}, {confidence}")
    difference = x - y
    rows = np.random.default_rng(seed).integers(0, difference.size, size=(resamples, difference.size))
    means = difference[rows].mean(axis=1)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return {
        "difference": float(difference.mean()),
        "low": float(low),
        "high": float(high),
        "n": int(difference.size),
        "resamples": resamples,
        "confidence": confidence,
    }
