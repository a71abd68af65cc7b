"""Uncertainty for the HC-DLM tables: the paired bootstrap of a difference between two systems scored on the same
rows (the same examples, or the same training seeds)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dihal_fast.errors import DihalValueError

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


def paired_bootstrap(
    a: Sequence[float] | Sequence[Sequence[float]],
    b: Sequence[float] | Sequence[Sequence[float]],
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> dict[str, float]:
    """``mean(a - b)`` with its percentile interval over ``resamples`` draws of the rows with replacement (row ``i``
    of ``a`` and of ``b`` are drawn together: the pairing removes the rows' shared difficulty from the interval).

    Two-dimensional ``a`` and ``b`` (training seeds x examples, the same examples in every row) are resampled on
    both axes at once: each draw takes seeds with replacement and, independently, examples with replacement, and
    averages ``a - b`` over the drawn cells, so the interval holds both the training seeds' spread and the test
    set's sampling noise (a two-stage bootstrap).

    Returns ``{difference, low, high, n, resamples, confidence}`` (``n``: rows; two-dimensional input adds
    ``examples``); float64 throughout, one NumPy generator of ``seed``, so the same inputs give the same interval."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.ndim not in (1, 2) or x.shape != y.shape or x.size == 0:
        raise DihalValueError(
            f"a paired bootstrap needs two equally shaped, non-empty rows (or seeds x examples tables) of values, "
            f"got {x.shape}, {y.shape}"
        )
    if resamples < 1 or not 0.0 < confidence < 1.0:
        raise DihalValueError(f"resamples must be >= 1 and confidence in (0, 1), got {resamples}, {confidence}")
    difference = x - y
    generator = np.random.default_rng(seed)
    rows = generator.integers(0, difference.shape[0], size=(resamples, difference.shape[0]))
    if difference.ndim == 1:
        means = difference[rows].mean(axis=1)
    else:
        columns = generator.integers(0, difference.shape[1], size=(resamples, difference.shape[1]))
        # the mean over drawn cells = mean over drawn seeds of (each seed's mean over the drawn examples)
        means = np.array([difference[r][:, c].mean() for r, c in zip(rows, columns)])
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    found = {
        "difference": float(difference.mean()),
        "low": float(low),
        "high": float(high),
        "n": int(difference.shape[0]),
        "resamples": resamples,
        "confidence": confidence,
    }
    if difference.ndim == 2:
        found["examples"] = int(difference.shape[1])
    return found


def points_text(interval: dict[str, float]) -> str:
    """A difference of accuracies with its interval, in percentage points: ``+1.2 [-0.5, +3.0]``."""
    return f"{100 * interval['difference']:+.1f} [{100 * interval['low']:+.1f}, {100 * interval['high']:+.1f}]"
