"""The float32 path of the proxies (``precision="float32"``) against the float64 reference.

Stated tolerance for float32 inputs (relative error): 1e-5 for m_curv and k_eff (largest seen over
random, low-rank and offset inputs: ~1.5e-6), 1e-3 for m_mono (largest seen: 2.4e-4, on nearly
rank-deficient inputs with n >= D, where the float32 covariance's rounding meets the ridge:
cond(Sigma + lam I) ~ 1e5; on full-rank inputs ~1e-6; for n < D the Gram route keeps float64
products and the error is ~1e-11). For float64 inputs the float32 path also rounds the input, which on
ill-conditioned data costs more (up to ~3e-4 on rank-3 data with 1e-3 noise); those are checked at 1e-2.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dihal_fast as df
from dihal_fast import reference as ref

RTOL_FLOAT32 = {"m_curv": 1e-5, "k_eff": 1e-5, "m_mono": 1e-3}


def _matrix(kind: str, n: int, D: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "low_rank":
        r = int(rng.integers(1, 5))
        return rng.standard_normal((n, r)) @ rng.standard_normal((r, D)) + 1e-3 * rng.standard_normal((n, D))
    if kind == "offset":
        return rng.standard_normal((n, D)) * 0.1 + 50.0
    return rng.standard_normal((n, D)) * 10.0 ** rng.uniform(-3, 3)


def _relative_errors(got: dict, want: dict) -> dict:
    return {name: abs(got[name] - want[name]) / abs(want[name]) for name in want}


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(20, 250),
    D=st.integers(2, 80),
    kind=st.sampled_from(["normal", "low_rank", "offset"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_float32_path_matches_reference_on_float32_inputs(n, D, kind, seed):
    X = _matrix(kind, n, D, np.random.default_rng(seed)).astype(np.float32)
    k = min(16, n - 1)
    got = df.geometry_proxies(X, k=k, n_pairs=2000, seed=seed, precision="float32")
    errors = _relative_errors(got, ref.geometry_proxies(X, k=k, n_pairs=2000, seed=seed))
    assert all(errors[name] <= RTOL_FLOAT32[name] for name in errors), errors


@pytest.mark.parametrize("kind", ["normal", "low_rank", "offset"])
def test_float32_path_on_float64_inputs(kind):
    X = _matrix(kind, 300, 70, np.random.default_rng(1))
    got = df.geometry_proxies(X, n_pairs=3000, precision="float32")
    errors = _relative_errors(got, ref.geometry_proxies(X, n_pairs=3000))
    assert max(errors.values()) <= 1e-2, errors


def test_single_proxies_take_the_precision():
    X = _matrix("low_rank", 200, 40, np.random.default_rng(2)).astype(np.float32)
    both = df.geometry_proxies(X, precision="float32")
    assert df.curvature_proxy(X, precision="float32") == both["m_curv"]
    assert df.monotonicity_proxy(X, precision="float32") == both["m_mono"]
    assert df.effective_rank(X, precision="float32") == both["k_eff"]
    assert df.effective_rank(X, precision="float64") == pytest.approx(ref.effective_rank(X), rel=1e-12)


def test_duplicate_rows_stay_finite_in_float32():
    X = np.repeat(np.random.default_rng(3).standard_normal((40, 6)), 3, axis=0).astype(np.float32)
    got = df.geometry_proxies(X, k=4, precision="float32")
    assert all(np.isfinite(v) and v > 0 for v in got.values())


@pytest.mark.parametrize("precision", ["float16", "double", None])
def test_unknown_precision_is_refused(precision):
    with pytest.raises(ValueError, match="precision must be one of"):
        df.geometry_proxies(np.random.default_rng(0).random((10, 3)), k=2, precision=precision)


def test_estimate_geometry_passes_the_precision():
    from dihal_fast.select import estimate_geometry

    rng = np.random.default_rng(4)
    vectors = {layer: _matrix("low_rank", 150, 30, rng).astype(np.float32) for layer in (1, 2, 3)}
    fast = estimate_geometry(vectors, [1, 2, 3], repeats=2, sample_size=100, precision="float32")
    exact = estimate_geometry(vectors, [1, 2, 3], repeats=2, sample_size=100)
    assert fast.config["precision"] == "float32" and exact.config["precision"] == "float64"
    for name in ("m_curv", "m_mono", "k_eff"):
        np.testing.assert_allclose(fast.values[name], exact.values[name], rtol=RTOL_FLOAT32[name])
