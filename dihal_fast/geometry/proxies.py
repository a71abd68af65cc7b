"""The public geometry proxies of DESIGN.md, composed from backend operations."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from dihal_fast.errors import DihalValueError
from dihal_fast.geometry.backends import PRECISIONS, GeometryOps, GramOps, get_backend
from dihal_fast.geometry.inputs import Matrix, MatrixLike, as_matrix, check_k, check_positive, check_seed
from dihal_fast.profiling import nvtx_range
from dihal_fast.reference import draw_pairs, weighted_median

DEFAULT_K = 16
DEFAULT_RIDGE = 1e-3
DEFAULT_PAIRS = 10000
DEFAULT_PRECISION = "float64"
# The ridges m_mono is defined for: below, (Sigma + lam I) of rank-deficient rows is too ill-conditioned for any
# float64 factorisation (the reference's included) to give the quotients; above, lam leaves float64's range.
RIDGE_RANGE = (1e-6, 1e300)


# Rows whose largest |x| lies within 2^+-this go to the kernels unchanged: their 8th powers (float64) or 4th
# powers (lower precisions) are normal numbers, so no product, norm or tolerance inside a kernel under- or
# overflows. Other rows are first multiplied by a power of two (exact in floating point) and the result
# mapped back through the proxies' scaling laws: X -> sX leaves k_eff unchanged and divides m_mono and
# m_curv by s^2 (Sigma, lam, eps and the local eigenvalues all scale as s^2).
SAFE_EXPONENT, SAFE_EXPONENT_LOW_PRECISION = 64, 16


def _prepare(
    X: MatrixLike, backend: str, min_rows: int = 2, precision: str = DEFAULT_PRECISION
) -> tuple[Matrix, GeometryOps, int]:
    """The checked matrix (rescaled by ``2^shift`` when its magnitude is extreme), its backend, and ``shift``."""
    if precision not in PRECISIONS:
        raise DihalValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    allow_cuda = backend in ("auto", "cuda", "cuvs")
    matrix = as_matrix(X, "X", min_rows=min_rows, allow_cuda=allow_cuda, max_abs=np.inf)
    if precision == "float32" and matrix.device == "cpu" and matrix.data.dtype == np.float64:
        matrix = replace(matrix, data=matrix.data.astype(np.float32))
    matrix, shift = _rescaled(matrix)
    return matrix, get_backend(backend, matrix.device), shift


def _rescaled(matrix: Matrix) -> tuple[Matrix, int]:
    """``matrix`` times ``2^shift`` so that its largest |x| is in [0.5, 1) when it is outside the safe range."""
    safe = SAFE_EXPONENT if str(matrix.data.dtype).endswith("float64") else SAFE_EXPONENT_LOW_PRECISION
    if matrix.largest == 0 or 2.0**-safe <= matrix.largest <= 2.0**safe:
        return matrix, 0
    shift = -math.frexp(matrix.largest)[1]
    if matrix.device == "cpu":
        data = np.ldexp(matrix.data, shift)
    else:
        import torch

        data = torch.ldexp(matrix.data, torch.tensor(shift, device=matrix.data.device))
    return replace(matrix, data=data, largest=math.ldexp(matrix.largest, shift)), shift


def _unscaled(name: str, value: float, shift: int) -> float:
    """A proxy computed on ``2^shift X`` mapped back to ``X`` (``value * 2^(2 shift)``, exact), or a ValueError
    when the true value is not a normal float64 number."""
    if shift == 0:
        return value
    try:
        result = math.ldexp(value, 2 * shift)
    except OverflowError:
        result = math.inf
    if not sys.float_info.min <= result < math.inf:
        magnitude = math.log10(value) + 2 * shift * math.log10(2)
        raise DihalValueError(
            f"{name} of these rows is about 1e{magnitude:.0f}, outside the range of normal float64 numbers; rescale X "
            "(m_mono and m_curv scale as 1 / scale^2, k_eff not at all)"
        )
    return result


def knn(X: MatrixLike, k: int = DEFAULT_K, backend: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """Exact k nearest rows of ``X`` (self excluded, ties to the lower index).

    Returns ``(indices, sqdist)``: int64 ``n x k`` and float64 squared Euclidean distances ``n x k``, each row
    sorted by distance. On the CPU the distances are the float64 ones of the input's values (whatever its
    dtype, so float32 rows of magnitude 1e-30 or 1e19 neither underflow nor overflow); the CUDA backend's
    low-precision distances carry the input precision's rounding.
    """
    matrix, ops, shift = _prepare(X, backend)
    k = check_k(k, matrix.shape[0])
    with nvtx_range("knn"):
        idx, d2 = ops.knn(matrix.data, k)
    with np.errstate(over="ignore"):  # an overflow to inf is refused below
        idx, d2 = np.asarray(idx), np.ldexp(np.asarray(d2, dtype=np.float64), -2 * shift)  # distances scale as s^2
    if not np.isfinite(d2).all():
        raise DihalValueError("squared distances between these rows overflow float64; rescale X")
    return idx, d2


@dataclass(frozen=True)
class _Moments:
    """Second moments of the centred rows: the D x D covariance, or, when ``n < D`` and the backend
    has the route, the n x n Gram matrix ``G = Xc Xc^T`` (cheaper; ``Sigma`` has the trace and the
    non-zero eigenvalues of ``G / n``)."""

    mean: Any  # None on the Gram route (differences of rows do not need it)
    matrix: Any
    scale: int  # trace and eigenvalues of Sigma are those of matrix / scale
    trace: float

    @property
    def gram(self) -> bool:
        return self.mean is None


def _moments(matrix: Matrix, ops: GeometryOps, precision: str) -> _Moments:
    n, D = matrix.shape
    with nvtx_range("covariance"):
        if n < D and hasattr(ops, "gram"):
            G = cast(GramOps, ops).gram(matrix.data)
            moments = _Moments(None, G, n, ops.trace(G) / n)
        else:
            mean, cov = ops.covariance(matrix.data, precision)
            moments = _Moments(mean, cov, 1, ops.trace(cov))
    if not moments.trace > 0:
        raise DihalValueError(f"X has zero variance (all {n} rows are identical); the proxies are undefined")
    return moments


def _k_eff(ops: GeometryOps, moments: _Moments, precision: str) -> float:
    with nvtx_range("top_eigen"):
        return moments.trace / (ops.top_eigenvalue(moments.matrix, precision) / moments.scale)


def _m_mono(
    matrix: Matrix, ops: GeometryOps, moments: _Moments, ridge: float, n_pairs: int, seed: int, precision: str
) -> float:
    n, D = matrix.shape
    lam = ridge * moments.trace / D
    if not (sys.float_info.min <= lam and math.isfinite(n * lam)):
        raise DihalValueError(
            f"ridge={ridge:g} puts lam = ridge * tr(Sigma) / D outside float64's range for these rows; rescale X"
        )
    pi, pj, counts = draw_pairs(n, n_pairs, seed)
    with nvtx_range("pairs"):
        if moments.gram:
            q = cast(GramOps, ops).gram_pair_quotients(matrix.data, moments.matrix, lam, pi, pj)
        else:
            q = ops.pair_quotients(matrix.data, moments.mean, moments.matrix, lam, pi, pj, precision)
    q = np.asarray(q)
    keep = ~np.isnan(q)
    if not keep.any():
        raise DihalValueError(f"all {n_pairs} sampled pairs are identical rows; m_mono is undefined")
    return _representable("m_mono", weighted_median(q[keep], counts[keep]), moments.trace / D)


def _m_curv(matrix: Matrix, ops: GeometryOps, moments: _Moments, k: int, precision: str) -> float:
    with nvtx_range("knn"):
        if moments.gram:
            idx, _ = cast(GramOps, ops).knn_from_gram(matrix.data, moments.matrix, k)
        else:
            idx, _ = ops.knn(matrix.data, k)
    with nvtx_range("local_eigen"):
        lam = np.asarray(ops.local_top_eigenvalues(matrix.data, idx, precision))
    eps = 1e-12 * moments.trace / matrix.shape[1]
    return _representable("m_curv", float(np.median(1.0 / np.maximum(lam, eps))), moments.trace / matrix.shape[1])


def _representable(name: str, value: float, variance: float) -> float:
    """``value``, or a ValueError when it overflows float64: m_mono and m_curv scale as 1 / variance, so rows
    whose per-dimension variance is near the smallest float64 (e.g. values ~1e-154) have no finite proxy."""
    if not np.isfinite(value):
        raise DihalValueError(
            f"{name} overflows float64 for these rows (mean per-dimension variance {variance:.3g}); "
            "rescale X (the proxies scale as 1 / scale^2)"
        )
    return value


def effective_rank(X: MatrixLike, backend: str = "auto", precision: str = DEFAULT_PRECISION) -> float:
    """``k_eff = tr(Sigma) / lambda_max(Sigma)`` of the population covariance of ``X`` (``precision``: see
    :func:`geometry_proxies`)."""
    matrix, ops, _ = _prepare(X, backend, precision=precision)  # k_eff is scale-free
    return _k_eff(ops, _moments(matrix, ops, precision), precision)


def monotonicity_proxy(
    X: MatrixLike,
    ridge: float = DEFAULT_RIDGE,
    n_pairs: int = DEFAULT_PAIRS,
    seed: int = 0,
    backend: str = "auto",
    precision: str = DEFAULT_PRECISION,
) -> float:
    """``m_mono``: median over ``n_pairs`` seeded pairs of the regularised-precision Rayleigh quotient.

    Memory does not grow with ``n_pairs``: up to 2^22 pairs are drawn one by one; above that the
    count of each distinct pair is drawn instead (same distribution, O(n^2) memory and time), which
    needs ``n (n - 1) / 2 <= 2^23`` (about n <= 4096 rows), else ``ValueError``. See
    :func:`dihal_fast.reference.draw_pairs`. ``ridge`` must lie in :data:`RIDGE_RANGE` (``[1e-6, 1e300]``);
    ``seed`` is an integer in ``[0, 2^63)``. ``precision``: see :func:`geometry_proxies`.
    """
    ridge, n_pairs, seed = _pair_arguments(ridge, n_pairs, seed)
    matrix, ops, shift = _prepare(X, backend, precision=precision)
    return _unscaled(
        "m_mono", _m_mono(matrix, ops, _moments(matrix, ops, precision), ridge, n_pairs, seed, precision), shift
    )


def _pair_arguments(ridge: Any, n_pairs: Any, seed: Any) -> tuple[float, int, int]:
    """The checked ``(ridge, n_pairs, seed)`` of m_mono, before any work."""
    ridge = check_positive(ridge, "ridge")
    if not RIDGE_RANGE[0] <= ridge <= RIDGE_RANGE[1]:
        raise DihalValueError(f"ridge must lie in [{RIDGE_RANGE[0]:g}, {RIDGE_RANGE[1]:g}], got {ridge:g}")
    return ridge, check_positive(n_pairs, "n_pairs", integer=True), check_seed(seed)


def curvature_proxy(
    X: MatrixLike, k: int = DEFAULT_K, backend: str = "auto", precision: str = DEFAULT_PRECISION
) -> float:
    """``m_curv``: median over rows of ``1 / lambda_max`` of the k-NN local covariance (``precision``: see
    :func:`geometry_proxies`)."""
    matrix, ops, shift = _prepare(X, backend, precision=precision)
    k = check_k(k, matrix.shape[0])
    return _unscaled("m_curv", _m_curv(matrix, ops, _moments(matrix, ops, precision), k, precision), shift)


def geometry_proxies(
    X: MatrixLike,
    k: int = DEFAULT_K,
    ridge: float = DEFAULT_RIDGE,
    n_pairs: int = DEFAULT_PAIRS,
    seed: int = 0,
    backend: str = "auto",
    precision: str = DEFAULT_PRECISION,
) -> dict[str, float]:
    """All three proxies of one layer's hidden states, sharing one covariance: ``m_curv, m_mono, k_eff``.

    ``ridge``, ``n_pairs`` and ``seed`` are bounded as in :func:`monotonicity_proxy`.

    Precision: ``"float64"`` (the default) computes every product in float64 from the input's values, whatever
    its dtype: equal to :mod:`dihal_fast.reference` on those values up to float64 rounding (relative
    differences about 1e-12). ``"float32"`` rounds the centred data to float32 and runs the covariance SYRK,
    the whitening solves and the local Gram matrices in float32, with sums, centring, the Cholesky factor and
    the eigenvalues in float64: faster, and float32-accurate (relative errors about 1e-8 on ``k_eff`` and
    ``m_curv``, 1e-5 on ``m_mono``, far below the spread between repeated subsamples; measured by
    bench/bench_proxies.py). The kNN is exact in both. The CUDA backend always takes the float64 path.
    """
    ridge, n_pairs, seed = _pair_arguments(ridge, n_pairs, seed)
    matrix, ops, shift = _prepare(X, backend, precision=precision)
    k = check_k(k, matrix.shape[0])
    moments = _moments(matrix, ops, precision)
    return {
        "m_curv": _unscaled("m_curv", _m_curv(matrix, ops, moments, k, precision), shift),
        "m_mono": _unscaled("m_mono", _m_mono(matrix, ops, moments, ridge, n_pairs, seed, precision), shift),
        "k_eff": _k_eff(ops, moments, precision),
    }
