"""The n < D route of the CPU backend: second moments, pair quotients and kNN candidates from the
n x n centred Gram matrix instead of the D x D covariance.

Stated tolerance of the proxies against the reference: relative 1e-7 (largest seen: ~2e-9 for m_mono
on rank-deficient data, where n (2 - n lam |L^-1 u|^2) loses digits to cancellation; ~1e-12 on
full-rank data). kNN indices are exact (certified re-rank)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dihal_fast as df
from dihal_fast import _native
from dihal_fast import reference as ref


def _matrix(kind: str, n: int, D: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "duplicates":
        X = np.repeat(rng.standard_normal((max(2, n // 3), D)), 3, axis=0)[:n]
        return np.concatenate([X, rng.standard_normal((n - len(X), D))]) + 5.0
    if kind == "grid":
        return rng.integers(-2, 3, size=(n, D)).astype(float)
    if kind == "offset":
        return 1e4 + rng.standard_normal((n, D)) * 1e-3
    if kind == "low_rank":
        r = int(rng.integers(1, 4))
        return rng.standard_normal((n, r)) @ rng.standard_normal((r, D)) + 1e-3 * rng.standard_normal((n, D))
    return rng.standard_normal((n, D))


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(3, 60),
    extra=st.integers(1, 60),
    kind=st.sampled_from(["normal", "duplicates", "grid", "offset", "low_rank"]),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_knn_from_gram_matches_reference(n, extra, kind, dtype, seed):
    rng = np.random.default_rng(seed)
    X = np.ascontiguousarray(_matrix(kind, n, n + extra, rng), dtype=dtype)
    k = int(rng.integers(1, n))
    core = _native.core()
    idx, d2 = core.knn_from_gram(X, core.centred_gram(X, False), k)
    ref_idx, ref_d2 = ref.knn(X, k)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(d2, ref_d2, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("kind", ["normal", "duplicates", "offset", "low_rank"])
@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_proxies_on_the_gram_route_match_reference(kind, precision):
    X = _matrix(kind, 120, 300, np.random.default_rng(3)).astype(np.float32)
    got = df.geometry_proxies(X, k=8, n_pairs=3000, precision=precision)
    want = ref.geometry_proxies(X, k=8, n_pairs=3000)
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-7 if precision == "float64" else 1e-5), name


def test_gram_route_agrees_with_the_covariance_route():
    # The same rows, seen with n < D (Gram route) and through the reference backend (covariance).
    X = _matrix("low_rank", 80, 200, np.random.default_rng(4))
    got = df.geometry_proxies(X, k=5, n_pairs=2000)
    want = df.geometry_proxies(X, k=5, n_pairs=2000, backend="reference")
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-7), name
