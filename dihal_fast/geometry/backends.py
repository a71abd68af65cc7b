"""Backend registry: one dispatch point for every geometry operation.

A backend is an object with the operations below; the public functions in
:mod:`dihal_fast.geometry.proxies` compose them. ``auto`` picks ``cuda`` for CUDA tensors and
``cpu`` otherwise; asking for a backend that cannot run raises :class:`BackendUnavailable`.

Operations (``X`` is a validated matrix as the backend expects it):
  covariance(X, precision) -> (mean, cov)   population covariance, float64
  trace(cov) -> float
  top_eigenvalue(cov, precision) -> float   largest eigenvalue of a PSD matrix
  knn(X, k) -> (indices, sqdist)            host int64 / float64 arrays
  local_top_eigenvalues(X, idx, precision) -> host float64 (n,)
  pair_quotients(X, mean, cov, lam, pi, pj, precision) -> host float64 (n_pairs,), NaN for identical rows
  covariance_update(X, count, mean, comoment) -> count   (upper triangle of comoment, in place)
Optional, for n < D (the CPU backend): the n x n route of the second moments
  gram(X) -> G                               centred Gram matrix Xc Xc^T, float64 products (n x n)
  gram_pair_quotients(X, G, lam, pi, pj) -> as pair_quotients, from G
  knn_from_gram(X, G, k) -> as knn, candidates from G

``precision`` is ``"float64"`` (products in float64: the exact path) or ``"float32"`` (products and
solves in float32, sums, centring, factorisations and eigenvalues in float64; see
:data:`PRECISIONS`). Backends without a float32 path compute the float64 one.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from dihal_fast import _native, reference
from dihal_fast._native import BackendUnavailable
from dihal_fast.errors import DihalValueError

BACKENDS = ("auto", "cpu", "cuda", "cuvs", "reference")
PRECISIONS = ("float64", "float32")
# Lanczos residual tolerance (relative) per precision: the eigenvalue error is at most the
# residual, and in practice its square over the spectral gap.
_LANCZOS_TOL = {"float64": 1e-12, "float32": 1e-6}


class CpuBackend:
    """C++ kernels (OpenMP + OpenBLAS) on host NumPy arrays."""

    name = "cpu"

    def __init__(self) -> None:
        self.core = _native.core()

    def covariance(self, X: np.ndarray, precision: str = "float64") -> tuple[np.ndarray, np.ndarray]:
        # One-shot proxies use a SYRK in the chosen precision merged in float64; the streaming
        # accumulator below keeps the input precision inside blocks for throughput.
        return self.core.covariance(X, precision == "float32")

    def trace(self, cov: np.ndarray) -> float:
        return float(np.trace(cov))

    def top_eigenvalue(self, cov: np.ndarray, precision: str = "float64") -> float:
        value, _ = self.core.top_eigenvalue_psd(cov, _LANCZOS_TOL[precision], precision == "float32")
        return float(value)

    def knn(self, X: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.core.knn(X, k)

    def local_top_eigenvalues(self, X: np.ndarray, idx: np.ndarray, precision: str = "float64") -> np.ndarray:
        return self.core.local_top_eigenvalues(X, idx, precision == "float32")

    def pair_quotients(self, X, mean, cov, lam, pi, pj, precision: str = "float64") -> np.ndarray:
        return self.core.pair_quotients(X, mean, cov, lam, pi, pj, precision == "float32")

    def covariance_update(self, X: np.ndarray, count: int, mean: np.ndarray, comoment: np.ndarray) -> int:
        return int(self.core.covariance_update(X, count, mean, comoment))

    def gram(self, X: np.ndarray) -> np.ndarray:
        # float64 products whatever the precision: the pair quotients from G subtract two terms
        # (n (2 - n lam |L^-1 u|^2)), which float32 products would not survive.
        return self.core.centred_gram(X, False)

    def gram_pair_quotients(self, X, G, lam, pi, pj) -> np.ndarray:
        n = G.shape[0]
        if n * lam <= np.trace(G) / n:
            return self.core.gram_pair_quotients(X, G, lam, pi, pj)
        return eigen_pair_quotients(X, G, lam, pi, pj)

    def knn_from_gram(self, X: np.ndarray, G: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.core.knn_from_gram(X, G, k)


class ReferenceBackend:
    """The NumPy float64 definitions from :mod:`dihal_fast.reference`."""

    name = "reference"

    def covariance(self, X: np.ndarray, precision: str = "float64") -> tuple[np.ndarray, np.ndarray]:
        return reference.covariance(X)

    def trace(self, cov: np.ndarray) -> float:
        return float(np.trace(cov))

    def top_eigenvalue(self, cov: np.ndarray, precision: str = "float64") -> float:
        return float(np.linalg.eigvalsh(cov)[-1])

    def knn(self, X: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return reference.knn(X, k)

    def local_top_eigenvalues(self, X: np.ndarray, idx: np.ndarray, precision: str = "float64") -> np.ndarray:
        return reference.local_top_eigenvalues(X, idx)

    def pair_quotients(self, X, mean, cov, lam, pi, pj, precision: str = "float64") -> np.ndarray:
        X = reference.to_float64(X)
        P = np.linalg.inv(cov + lam * np.eye(cov.shape[0]))
        d = X[pi] - X[pj]
        den = np.einsum("pd,pd->p", d, d)
        num = np.einsum("pd,de,pe->p", d, P, d)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)

    def covariance_update(self, X: np.ndarray, count: int, mean: np.ndarray, comoment: np.ndarray) -> int:
        nb = X.shape[0]
        bmean, bcov = reference.covariance(X)
        delta = bmean - mean
        total = count + nb
        comoment += bcov * nb + np.outer(delta, delta) * (count * nb / total)
        mean += delta * (nb / total)
        return total


def eigen_pair_quotients(
    X: np.ndarray, G: np.ndarray, lam: float, pi: np.ndarray, pj: np.ndarray, chunk: int = 4096
) -> np.ndarray:
    """The pair quotients from the eigenvectors of ``G = V diag(g) V^T`` (``n < D``): with ``w = (V^T u)^2``,
    ``u = e_i - e_j``, ``d^T (Sigma + lam I)^-1 d = n sum_k w_k g_k / (g_k + n lam)``, a sum of positive terms.

    The Cholesky route's ``n (2 - n lam ||L^-1 u||^2)`` subtracts two numbers near 2 once ``n lam`` exceeds the
    spectrum of G (a relative error of about eps * n * ridge / D); this form has no cancellation at any ridge,
    for an n x n eigendecomposition instead of a Cholesky factor."""
    n = G.shape[0]
    g, V = np.linalg.eigh(G)
    g = np.maximum(g, 0.0)  # rounding below zero (the centring direction) carries no weight
    weight = n * (g / (g + n * lam))
    out = np.empty(len(pi))
    for p0 in range(0, len(pi), chunk):
        i, j = pi[p0 : p0 + chunk], pj[p0 : p0 + chunk]
        d = X[i].astype(np.float64) - X[j]
        den = np.einsum("pd,pd->p", d, d)
        num = np.square(V[i] - V[j]) @ weight
        with np.errstate(invalid="ignore", divide="ignore"):
            out[p0 : p0 + chunk] = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return out


def symmetrize_upper(M: np.ndarray) -> np.ndarray:
    """The symmetric matrix whose upper triangle is that of ``M``."""
    upper = np.triu(M)
    return upper + np.triu(M, 1).T


class GeometryOps(Protocol):
    """The operations every backend has (the module doc); arrays are NumPy or torch, as the backend expects."""

    def covariance(self, X: Any, precision: str = "float64") -> tuple[Any, Any]: ...

    def trace(self, cov: Any) -> float: ...

    def top_eigenvalue(self, cov: Any, precision: str = "float64") -> float: ...

    def knn(self, X: Any, k: int) -> tuple[Any, Any]: ...

    def local_top_eigenvalues(self, X: Any, idx: Any, precision: str = "float64") -> Any: ...

    def pair_quotients(
        self, X: Any, mean: Any, cov: Any, lam: float, pi: Any, pj: Any, precision: str = "float64"
    ) -> Any: ...

    def covariance_update(self, X: Any, count: int, mean: Any, comoment: Any) -> int: ...


class GramOps(GeometryOps, Protocol):
    """The optional n x n route of a backend that has it (``hasattr(ops, "gram")``; the CPU backend)."""

    def gram(self, X: Any) -> Any: ...

    def gram_pair_quotients(self, X: Any, G: Any, lam: float, pi: Any, pj: Any) -> Any: ...

    def knn_from_gram(self, X: Any, G: Any, k: int) -> tuple[Any, Any]: ...


_INSTANCES: dict[str, GeometryOps] = {}


def get_backend(backend: str, device: str = "cpu") -> GeometryOps:
    """The backend object for ``backend`` given where the data lives (``cpu`` or ``cuda``)."""
    if backend not in BACKENDS:
        raise DihalValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = "cuda" if device == "cuda" else "cpu"
    if device == "cuda" and backend in ("cpu", "reference"):
        raise DihalValueError(f"backend={backend!r} runs on the host; move the CUDA tensor with .cpu() first")
    if backend not in _INSTANCES:
        _INSTANCES[backend] = _create(backend)
    return _INSTANCES[backend]


def _create(backend: str) -> GeometryOps:
    if backend == "cpu":
        return CpuBackend()
    if backend == "reference":
        return ReferenceBackend()
    # cuda / cuvs: the GPU kernels register here once compiled (see dihal_fast.geometry.backend_cuda).
    try:
        from dihal_fast.geometry import backend_cuda
    except ImportError:
        _native.cuda_module()  # raises with the reason when the module is missing or has no device
        raise BackendUnavailable(f"backend={backend!r}: the CUDA kernels are not part of this build") from None
    return backend_cuda.create(backend)
