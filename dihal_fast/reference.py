"""Plain NumPy float64 implementations of every geometry definition in DESIGN.md.

These are the ground truth the compiled kernels are tested against: short, literal and slow
(``O(n^2 D)`` memory-light loops, dense inverses). Use ``backend="reference"`` in the public API
to run them through the same argument checks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from dihal_fast.errors import DihalValueError


def to_float64(X) -> np.ndarray:
    """A float64 NumPy copy of a NumPy array or torch tensor (any device, dtype or stride)."""
    if hasattr(X, "detach"):
        X = X.detach().to("cpu").double().numpy()
    return np.array(X, dtype=np.float64, copy=True)


# Up to this many pairs are drawn one by one; beyond it only their counts per distinct pair are drawn.
DIRECT_PAIRS = 1 << 22
# Largest number of distinct unordered pairs n (n - 1) / 2 whose counts are kept (about 200 MB).
MAX_DISTINCT_PAIRS = 1 << 23


def draw_pairs(n: int, n_pairs: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n_pairs`` pairs ``(i, j)``, ``i != j``, uniform over the rows, from ``seed``: ``(i, j, counts)``.

    This sampler *is* part of the definition of ``m_mono``: every backend uses it. Up to
    :data:`DIRECT_PAIRS` the pairs are drawn one by one (``counts`` all 1). Above it, memory must not
    grow with ``n_pairs``: as ``m_ij`` is symmetric, only the multiplicity of each of the
    ``n (n - 1) / 2`` unordered pairs matters, and it is drawn directly (multinomial, the same
    distribution as ``n_pairs`` independent draws); the pairs returned are the distinct ones drawn,
    ``i < j``, each with its count. Memory is then O(n^2) and time O(n^2), whatever ``n_pairs``.
    Raises ``ValueError`` when ``n_pairs > DIRECT_PAIRS`` and ``n (n - 1) / 2 > MAX_DISTINCT_PAIRS``.
    """
    rng = np.random.default_rng(seed)
    if n_pairs <= DIRECT_PAIRS:
        i = rng.integers(0, n, size=n_pairs, dtype=np.int64)
        j = rng.integers(0, n - 1, size=n_pairs, dtype=np.int64)
        j += j >= i
        return i, j, np.ones(n_pairs, dtype=np.int64)
    distinct = n * (n - 1) // 2
    if distinct > MAX_DISTINCT_PAIRS:
        raise DihalValueError(
            f"n_pairs={n_pairs:,} is above {DIRECT_PAIRS:,} (the pairs drawn one by one) and the n = {n:,} rows "
            f"have {distinct:,} distinct pairs, more than the {MAX_DISTINCT_PAIRS:,} whose counts are kept; "
            f"use n_pairs <= {DIRECT_PAIRS:,} or fewer rows"
        )
    counts = rng.multinomial(n_pairs, np.full(distinct, 1.0 / distinct))
    drawn = np.flatnonzero(counts)
    i, j = np.triu_indices(n, 1)
    return i[drawn], j[drawn], counts[drawn]


def weighted_median(values: np.ndarray, counts: np.ndarray) -> float:
    """``np.median(np.repeat(values, counts))`` without forming the repeated array."""
    order = np.argsort(values, kind="stable")
    ends = np.cumsum(counts[order])
    total = int(ends[-1])
    lo, hi = np.searchsorted(ends, [(total - 1) // 2, total // 2], side="right")
    low, high = float(values[order[lo]]), float(values[order[hi]])
    middle = (low + high) / 2  # np.median's arithmetic (exact for subnormals, where halving first would round to 0)
    return middle if math.isfinite(middle) else low / 2 + high / 2  # near the float64 limit the sum overflows


def covariance(X) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population covariance ``(X - mu)^T (X - mu) / n``."""
    X = to_float64(X)
    mu = X.mean(axis=0)
    Xc = X - mu
    return mu, Xc.T @ Xc / X.shape[0]


def effective_rank(X) -> float:
    """``tr(Sigma) / lambda_max(Sigma)``."""
    _, S = covariance(X)
    return float(np.trace(S) / np.linalg.eigvalsh(S)[-1])


def monotonicity_proxy(X, ridge: float = 1e-3, n_pairs: int = 10000, seed: int = 0) -> float:
    """Median over sampled pairs of ``d^T (Sigma + lam I)^-1 d / ||d||^2``, ``lam = ridge tr(Sigma)/D``."""
    X = to_float64(X)
    _, S = covariance(X)
    D = S.shape[0]
    P = np.linalg.inv(S + ridge * np.trace(S) / D * np.eye(D))
    i, j, counts = draw_pairs(X.shape[0], n_pairs, seed)
    d = X[i] - X[j]
    den = np.einsum("pd,pd->p", d, d)
    keep = den > 0
    num = np.einsum("pd,de,pe->p", d[keep], P, d[keep])
    return weighted_median(num / den[keep], counts[keep])


def knn(X, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force k nearest rows (self excluded, ties to the lower index) and squared distances."""
    X = to_float64(X)
    n = X.shape[0]
    idx = np.empty((n, k), dtype=np.int64)
    dist = np.empty((n, k), dtype=np.float64)
    for r in range(n):
        diff = X - X[r]
        d = np.einsum("nd,nd->n", diff, diff)
        d[r] = np.inf
        order = np.argsort(d, kind="stable")[:k]
        idx[r], dist[r] = order, d[order]
    return idx, dist


def local_top_eigenvalues(X, indices: np.ndarray) -> np.ndarray:
    """Top eigenvalue of each row's neighbourhood covariance (row + its neighbours, normalised by k+1)."""
    X = to_float64(X)
    out = np.empty(X.shape[0])
    for r in range(X.shape[0]):
        N = X[np.concatenate(([r], indices[r]))]
        N = N - N.mean(axis=0)
        out[r] = np.linalg.eigvalsh(N @ N.T)[-1] / N.shape[0]
    return out


def curvature_proxy(X, k: int = 16) -> float:
    """``median_i 1 / max(lambda_max(Sigma_i), eps)``, ``eps = 1e-12 tr(Sigma) / D``."""
    X = to_float64(X)
    _, S = covariance(X)
    eps = 1e-12 * np.trace(S) / S.shape[0]
    idx, _ = knn(X, k)
    lam = local_top_eigenvalues(X, idx)
    return float(np.median(1.0 / np.maximum(lam, eps)))


def geometry_proxies(X, k: int = 16, ridge: float = 1e-3, n_pairs: int = 10000, seed: int = 0) -> dict[str, float]:
    """The three proxies of one layer: ``m_curv``, ``m_mono``, ``k_eff``."""
    return {
        "m_curv": curvature_proxy(X, k),
        "m_mono": monotonicity_proxy(X, ridge, n_pairs, seed),
        "k_eff": effective_rank(X),
    }


def selection_scores(proxies_by_layer: Mapping[int, Mapping[str, float]]) -> tuple[dict[int, float], int]:
    """``z(log m_curv) + z(log m_mono) - z(log k_eff)`` across layers; best layer, ties to the shallower."""
    layers = sorted(proxies_by_layer)

    def z(name: str) -> np.ndarray:
        v = np.log([float(proxies_by_layer[l][name]) for l in layers])
        sd = v.std()  # a column constant up to rounding has no spread: z = 0
        return (v - v.mean()) / sd if sd > 1e-12 * max(1.0, abs(v.mean())) else np.zeros_like(v)

    score = z("m_curv") + z("m_mono") - z("k_eff")
    best = layers[int(np.argmax(score))]
    return {l: float(s) for l, s in zip(layers, score)}, best
