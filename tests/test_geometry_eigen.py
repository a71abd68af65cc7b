"""The small symmetric eigenvalue routine of the local-curvature kernel (Householder, then Laguerre's
iteration on the tridiagonal matrix with a Sturm-bisection finish) on the cases where an iteration
could stall: multiple, clustered, zero and negative top eigenvalues, diagonal and graded matrices.
Stated tolerance: 1e-13 relative to the largest |eigenvalue| (largest seen ~3e-15)."""

from __future__ import annotations

import numpy as np
import pytest

from dihal_fast import _native


def _with_spectrum(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    Q, _ = np.linalg.qr(rng.standard_normal((len(values), len(values))))
    A = Q @ np.diag(values) @ Q.T
    return (A + A.T) / 2


def _cases(m: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    B = rng.standard_normal((m, m))
    low = rng.standard_normal((m, 2))
    clustered = np.ones(m)
    clustered[: m // 2] += 1e-10 * rng.random(m // 2)
    negative = np.full(m, -3.0)
    negative[0] = -1.0
    return {
        "random": B + B.T,
        "low_rank_psd": low @ low.T,
        "diagonal": np.diag(rng.standard_normal(m)),
        "multiple_top": np.diag(np.full(m, 2.5)),
        "zero": np.zeros((m, m)),
        "clustered_top": _with_spectrum(clustered, rng),
        "negative_top": _with_spectrum(negative, rng),
        "graded": _with_spectrum(10.0 ** rng.uniform(-30, 30, m), rng),
        "tiny_scale": (B @ B.T) * 1e-140,
        "huge_scale": (B @ B.T) * 1e140,
    }


@pytest.mark.parametrize("m", [1, 2, 3, 5, 17, 33])
def test_top_eigenvalue_small_on_hard_spectra(m):
    core = _native.core()
    rng = np.random.default_rng(m)
    for name, A in _cases(m, rng).items():
        eigenvalues = np.linalg.eigvalsh(A)
        scale = max(np.abs(eigenvalues).max(), np.finfo(float).tiny)
        got = core.top_eigenvalue_small(np.ascontiguousarray(A))
        assert abs(got - eigenvalues[-1]) <= 1e-13 * scale, (name, got, eigenvalues[-1])
