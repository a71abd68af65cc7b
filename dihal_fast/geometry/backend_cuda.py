"""CUDA backend: the geometry operations of :mod:`dihal_fast.geometry.backends` on the GPU.

Matrices are torch CUDA tensors (host arrays are uploaded once); they stay on the device, every
kernel runs on the caller's current stream, and temporaries come from torch's caching allocator.
The kernels (``dihal_fast._cuda``, sources in ``csrc/cuda``) link only the static CUDA runtime;
cuBLAS is opened on first use from a CUDA build of torch, the ``nvidia-cublas`` wheels or the CUDA
toolkit, and cuVS (``backend="cuvs"``) from the ``libcuvs`` wheels. Whatever is missing raises
:class:`BackendUnavailable` naming it and what to install.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import os
import re
import sys
import threading
from types import ModuleType
from typing import Any

import numpy as np

from dihal_fast import _native
from dihal_fast._native import BackendUnavailable
from dihal_fast.errors import DihalTypeError, DihalValueError

_CHUNK_BYTES = 256 << 20  # float64 scratch per chunk of exact distance rows / neighbourhoods
_DENSE_EIGEN_MAX = 256  # covariances up to this size use a dense eigensolver
_LANCZOS_CHECK_EVERY = 8
# cuBLAS's floating-point emulation switches (CUDA 12.9+/13: bf16x9 for float32, fixed point for float64 GEMMs),
# read by cuBLAS at initialisation for every handle of the process. The kNN certificate assumes IEEE products
# in the working type (csrc/knn_logic.hpp), so the backend refuses to start with any of them set.
_CUBLAS_EMULATION_ENV = re.compile(r"CUBLAS_(EMULATE_\w+|EMULATION_\w+|FIXEDPOINT_EMULATION_\w+)")
# The share of rows the candidate kernel itself certifies on ordinary data (tools/gpu_first_run.py, GPU tests):
# below it the kernel is broken even when the fallbacks make every answer right.
MIN_KERNEL_CERTIFIED_SHARE = 0.99
_log = logging.getLogger(__name__)


def cublas_emulation_refusal(environ: dict[str, str] | os._Environ[str]) -> str:
    """One line refusing the cuBLAS emulation variables set in ``environ`` ('' when none is); a variable set to
    0 or empty switches nothing on and passes."""
    found = sorted(f"{k}={v}" for k, v in environ.items() if _CUBLAS_EMULATION_ENV.fullmatch(k) and v not in ("", "0"))
    if not found:
        return ""
    return (
        f"cuBLAS floating-point emulation is switched on ({', '.join(found)}); the kNN certificate assumes IEEE "
        "products in the working type: unset these variables for this process"
    )


def build_refusal(name: str, backends: dict) -> str:
    """One line saying that this build lacks what backend ``name`` needs, and how to get it ('' when it has it),
    from ``build_info()["backends"]`` (``backends``): a build without CUDA refuses ``cuda`` and ``cuvs``, one
    without cuVS refuses ``cuvs``, whatever the machine's GPUs."""
    cuda, cuvs = backends.get("cuda", {}), backends.get("cuvs", {})
    if not cuda.get("compiled"):
        return (
            f"backend={name!r}: this dihal_fast was built without CUDA ({cuda.get('reason') or 'no CUDA module'}); "
            "pip install dihal_fast_cu12 or dihal_fast_cu13 (the wheel of your driver's CUDA major, see "
            "docs/INSTALL.md), or build on a machine with nvcc: DIHAL_CUDA=ON pip install ."
        )
    if name == "cuvs" and not cuvs.get("compiled"):
        return (
            "backend='cuvs': this dihal_fast was built without cuVS (its headers were not found at build time); "
            "the dihal_fast_cu12 / dihal_fast_cu13 wheels for Python >= 3.11 have it (with the libcuvs wheel of "
            "their release, docs/INSTALL.md), or pip install libcuvs-cu13 (or -cu12) and rebuild with DIHAL_CUVS=ON; "
            "backend='cuda' needs no cuVS"
        )
    return ""


def create(name: str) -> CudaBackend:
    """The ``cuda`` (own kNN kernel) or ``cuvs`` (cuVS brute-force candidates) backend; what the build lacks is
    said before what the machine lacks (:func:`build_refusal`)."""
    refusal = build_refusal(name, _native.build_info()["backends"])
    if refusal:
        raise BackendUnavailable(refusal)
    refusal = cublas_emulation_refusal(os.environ)
    if refusal:
        raise DihalValueError(f"backend={name!r}: {refusal}")
    module = _native.cuda_module()  # BackendUnavailable: not compiled, or no usable device
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailable(
            f"backend={name!r} needs a CUDA build of torch; torch {torch.__version__} cannot use the GPU "
            "(install torch from the CUDA wheel index matching your driver)"
        )
    # cuBLAS of the CUDA runtime's major only: a cu13 module on libcublas.so.12 would mix majors.
    major = int(module.build_info()["cuda_runtime_version"]) // 1000
    try:
        module.load_cublas(_library_candidates("libcublas", (major,), ("cu13/lib", "cublas/lib", "cu12/lib")))
    except RuntimeError as exc:
        raise BackendUnavailable(
            f"backend={name!r} needs cuBLAS and it could not be loaded ({exc}). Install it with "
            "`pip install nvidia-cublas` (CUDA 13) or `pip install nvidia-cublas-cu12` (CUDA 12); "
            "a CUDA build of torch ships it too"
        ) from None
    if name == "cuvs":
        _load_cuvs(module)
    return CudaBackend(module, use_cuvs=name == "cuvs")


def require_capability(module: ModuleType, name: str, device) -> None:
    """BackendUnavailable unless ``device`` (the device of the rows, not the current one) is sm_80 or newer."""
    import torch

    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 0):
        raise BackendUnavailable(
            f"backend={name!r}: the kernels are built for sm_80 and newer (architectures "
            f"{module.build_info()['cuda_architectures']}); {device} is sm_{capability[0]}{capability[1]}"
        )


def _site_dirs() -> list[str]:
    return [p for p in dict.fromkeys(sys.path) if p and os.path.isdir(p)]


def _library_candidates(stem: str, majors: tuple[int, ...], wheel_dirs: tuple[str, ...]) -> list[str]:
    """Sonames first (already loaded by torch, or on the loader path), then nvidia wheels, then the toolkit."""
    names = [f"{stem}.so.{m}" for m in majors]
    roots = [os.path.join(site, "nvidia", sub) for site in _site_dirs() for sub in wheel_dirs]
    roots += [os.path.join(home, "lib64") for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if home]
    return names + [os.path.join(r, name) for r in roots for name in names if os.path.exists(os.path.join(r, name))]


def cuvs_requirement(info: dict) -> str:
    """The libcuvs wheel a module of ``build_info()`` ``info`` can use: its CUDA major, the cuVS release of its
    headers (``load_cuvs`` refuses any other release, see csrc/cuda/cuvs_version.hpp)."""
    cuda_major = int(info["cuda_runtime_version"]) // 1000
    release = ".".join(info["cuvs_version"].split(".")[:2])
    return f"libcuvs-cu{cuda_major}=={release}.*" if release else f"libcuvs-cu{cuda_major}"


def _load_cuvs(module: ModuleType) -> None:
    info = module.build_info()  # cuvs_compiled: checked by build_refusal
    candidates = ["libcuvs_c.so"]
    spec = importlib.util.find_spec("libcuvs")
    if spec is not None and spec.submodule_search_locations:
        import libcuvs  # loads libcuvs.so and its RAPIDS dependencies from their wheels

        libcuvs.load_library()
        candidates.append(os.path.join(list(spec.submodule_search_locations)[0], "lib64", "libcuvs_c.so"))
    try:
        module.load_cuvs(candidates)
    except RuntimeError as exc:
        raise BackendUnavailable(
            f"backend='cuvs' needs libcuvs_c.so of cuVS {info['cuvs_version']} and it could not be loaded ({exc}). "
            f'Install it with `pip install "{cuvs_requirement(info)}"`'
        ) from None


def gemm_candidates(X, rows, k: int, cap: int, idx, d2):
    """The kNN of ``rows`` of X (any torch device) as a blocked float64 GEMM: the rows centred at the column mean in
    float64, distances ``|q|^2 + |r|^2 - 2 q.r`` against tiles of all rows, the ``cap`` smallest per row re-ranked
    with exact float64 distances, and certified by the float64 Gram model of csrc/knn_logic.hpp (knn_certify_limit).
    Writes the certified rows of ``idx`` / ``d2`` (n x k) and returns the certified mask over ``rows``; the rest
    need exact distances to all rows. This is the fallback of the candidate kernel (rows it could not certify, or
    ``k`` beyond its lists): GEMM work instead of reading all of X once per row."""
    import torch

    core = _native.core()
    n, D = X.shape
    mean = X.mean(dim=0, dtype=torch.float64)
    tile = max(1, _CHUNK_BYTES // (8 * D))  # reference rows per float64 tile
    norms = torch.cat([((X[r0 : r0 + tile].double() - mean) ** 2).sum(dim=1) for r0 in range(0, n, tile)])
    max_norm2 = float(norms.max())
    certified = torch.zeros(rows.numel(), dtype=torch.bool, device=X.device)
    complete = cap >= n - 1
    per_chunk = max(1, min(_CHUNK_BYTES // (8 * n), _CHUNK_BYTES // (8 * D * max(cap, 1))))
    for c0 in range(0, rows.numel(), per_chunk):
        chunk = rows[c0 : c0 + per_chunk]
        Q = X[chunk].double() - mean
        approx = torch.empty((chunk.numel(), n), dtype=torch.float64, device=X.device)
        for r0 in range(0, n, tile):
            R = X[r0 : r0 + tile].double() - mean
            approx[:, r0 : r0 + R.shape[0]] = norms[chunk, None] + norms[None, r0 : r0 + R.shape[0]] - 2.0 * (Q @ R.T)
        approx[torch.arange(chunk.numel(), device=X.device), chunk] = float("inf")
        width = min(cap, n - 1)
        values, cand = torch.topk(approx, width, dim=1, largest=False, sorted=True)
        threshold = values[:, -1]
        cand, _ = torch.sort(cand, dim=1)  # by index first, so the stable sort below ties to the lower index
        exact = ((X[cand].double() - X[chunk, None].double()) ** 2).sum(dim=2)
        exact, order = torch.sort(exact, dim=1, stable=True)
        cand = torch.gather(cand, 1, order)
        limit = core.knn_certify_limit("gram", D, exact[:, k - 1].cpu().numpy(), norms[chunk].cpu().numpy(), max_norm2)
        ok = (
            torch.as_tensor(limit, device=X.device) < threshold
            if not complete
            else torch.ones_like(threshold, dtype=torch.bool)
        )
        idx[chunk[ok]] = cand[ok, :k]
        d2[chunk[ok]] = exact[ok, :k]
        certified[c0 : c0 + chunk.numel()] = ok
    return certified


@dataclasses.dataclass(frozen=True)
class KnnStats:
    """Where the rows of one CUDA / cuVS kNN call got their answer: certified by the candidate kernel, by the float64
    GEMM pass (:func:`gemm_candidates`), or recomputed from exact distances to all rows. ``kernel_rows`` marks the
    kernel's rows (NumPy bool, length ``rows``)."""

    backend: str
    rows: int
    kernel_certified: int
    float64_certified: int
    exact: int
    kernel_rows: np.ndarray = dataclasses.field(repr=False, compare=False)

    @property
    def kernel_share(self) -> float:
        return self.kernel_certified / self.rows if self.rows else 1.0

    def summary(self) -> str:
        return (
            f"{self.backend} kNN: {self.kernel_certified} of {self.rows} rows certified by the kernel "
            f"({100 * self.kernel_share:.2f} %), {self.float64_certified} by the float64 pass, {self.exact} exact"
        )

    def as_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "kernel_rows"} | {
            "kernel_share": self.kernel_share
        }


def certified_share_problems(
    stats: KnnStats, idx, d2, ref_idx, ref_d2, min_share: float = MIN_KERNEL_CERTIFIED_SHARE
) -> list[str]:
    """What is wrong with a kNN call on ordinary data: the kernel certified fewer than ``min_share`` of the rows, or a
    row it certified differs from the float64 reference (``ref_idx`` / ``ref_d2``: other neighbours, or distances
    off by more than 1e-12 relative, NaN included). Empty: nothing."""
    problems = []
    if stats.kernel_share < min_share:
        problems.append(f"{stats.summary()}: below the {100 * min_share:.0f} % a working kernel certifies")
    mask = stats.kernel_rows
    wrong_idx = (np.asarray(idx)[mask] != np.asarray(ref_idx)[mask]).any(axis=1)
    mine, theirs = np.asarray(d2, dtype=np.float64)[mask], np.asarray(ref_d2, dtype=np.float64)[mask]
    wrong_d2 = ~(np.abs(mine - theirs) <= 1e-12 * np.abs(theirs) + 1e-300).all(axis=1)  # NaN is never <=
    wrong = np.flatnonzero(wrong_idx | wrong_d2)
    if wrong.size:
        rows = np.flatnonzero(mask)[wrong[:5]].tolist()
        problems.append(
            f"{wrong.size} rows certified by the {stats.backend} kernel differ from the reference (rows {rows})"
        )
    return problems


_stats_lock = threading.Lock()
_last_stats: KnnStats | None = None


def last_knn_stats() -> KnnStats | None:
    """The :class:`KnnStats` of the most recent CUDA / cuVS kNN call of this process (any thread), None before one."""
    with _stats_lock:
        return _last_stats


def _record(stats: KnnStats) -> None:
    global _last_stats
    with _stats_lock:
        _last_stats = stats
    _log.debug(stats.summary())


def resolve_uncertified(X, k: int, flags, capacity: int, idx, d2, exact_rows, backend: str) -> KnnStats:
    """The fallbacks of the kNN after the candidate kernel, on torch tensors of any device: rows with nonzero
    ``flags`` (all rows when ``flags`` is None: no kernel ran) go to the float64 GEMM pass, those it cannot certify
    to ``exact_rows(rows)``; ``idx`` / ``d2`` are completed in place. Returns where each row's answer came from."""
    import torch

    n = X.shape[0]
    rows = torch.arange(n, device=X.device) if flags is None else torch.nonzero(flags).flatten()
    kernel_rows = torch.ones(n, dtype=torch.bool, device=X.device)
    kernel_rows[rows] = False
    after_gemm = rows
    if rows.numel():
        certified = gemm_candidates(X, rows, k, capacity, idx, d2)
        after_gemm = rows[~certified]
    if after_gemm.numel():
        exact_rows(after_gemm)
    return KnnStats(
        backend=backend,
        rows=n,
        kernel_certified=n - rows.numel(),
        float64_certified=rows.numel() - after_gemm.numel(),
        exact=after_gemm.numel(),
        kernel_rows=kernel_rows.cpu().numpy(),
    )


class CudaBackend:
    """Kernels of ``dihal_fast._cuda`` on CUDA tensors; results that the proxies reduce on the host
    (kNN, local eigenvalues, pair quotients) come back as NumPy arrays, the covariance stays on the GPU."""

    def __init__(self, module: ModuleType, use_cuvs: bool) -> None:
        import torch

        self._torch = torch
        self._m = module
        self.use_cuvs = use_cuvs
        self.name = "cuvs" if use_cuvs else "cuda"
        self._codes = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}
        self._checked_devices: set[int] = set()

    # ------------------------------------------------------------------ helpers
    def _matrix(self, X: Any):
        """A contiguous CUDA tensor of a supported dtype (NumPy arrays and CPU tensors are uploaded)."""
        torch = self._torch
        if isinstance(X, np.ndarray):
            X = torch.from_numpy(np.ascontiguousarray(X))
        if X.device.type != "cuda":
            X = X.to(torch.device("cuda", torch.cuda.current_device()))
        if X.dtype not in self._codes:
            raise DihalTypeError(f"X must be float16, bfloat16, float32 or float64, got {X.dtype}")
        if X.device.index not in self._checked_devices:
            require_capability(self._m, self.name, X.device)
            self._checked_devices.add(X.device.index)
        return X.detach().contiguous()

    def _on(self, X, values: Any, dtype) -> Any:
        """``values`` (NumPy or tensor) as a contiguous tensor of ``dtype`` on X's device."""
        return self._torch.as_tensor(values, dtype=dtype, device=X.device).contiguous()

    def _launch(self, X) -> tuple[int, int]:
        """(device index, current stream handle) for kernels on X's device."""
        return X.device.index, self._torch.cuda.current_stream(X.device).cuda_stream

    def _workspace(self, X, nbytes: int):
        return self._torch.empty(max(int(nbytes), 1), dtype=self._torch.uint8, device=X.device)

    def _indices(self, X, indices: Any, what: str):
        """Row indices (NumPy or tensor) as a contiguous int64 tensor on X's device, checked against n."""
        torch = self._torch
        n = X.shape[0]
        t = (
            indices.to(X.device, torch.int64)
            if isinstance(indices, torch.Tensor)
            else self._on(X, indices, torch.int64)
        )
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= n):
            raise DihalValueError(f"{what} must lie in [0, {n}), got values in [{int(t.min())}, {int(t.max())}]")
        return t.contiguous()

    # ------------------------------------------------------------------ covariance
    def _covariance_update(self, X, count: int, mean, comoment, exact: bool) -> int:
        n, D = X.shape
        ws = self._workspace(X, self._m.covariance_workspace(n, D, self._codes[X.dtype], exact))
        return int(
            self._m.covariance_update(
                X.data_ptr(),
                self._codes[X.dtype],
                n,
                D,
                int(count),
                mean.data_ptr(),
                comoment.data_ptr(),
                exact,
                ws.data_ptr(),
                ws.numel(),
                *self._launch(X),
            )
        )

    def covariance(self, X: Any, precision: str = "float64"):
        """(mean, covariance) as float64 CUDA tensors; float64 products (whatever ``precision``), exact to float64
        rounding."""
        torch = self._torch
        X = self._matrix(X)
        n, D = X.shape
        mean = torch.zeros(D, dtype=torch.float64, device=X.device)
        M = torch.zeros((D, D), dtype=torch.float64, device=X.device)
        self._covariance_update(X, 0, mean, M, exact=True)
        return mean, (torch.triu(M) + torch.triu(M, 1).T) / n

    def covariance_update(self, X: Any, count: int, mean: Any, comoment: Any) -> int:
        """Streaming update in place: float16 / bfloat16 / float32 blocks centred in float32 (as on the CPU), float32
        products and sums; float64 blocks in float64.

        ``mean`` / ``comoment`` may be float64 CUDA tensors (kept on the GPU, the fast path) or NumPy
        arrays, which are copied to the device and back around the update (O(D^2) per call).
        """
        torch = self._torch
        X = self._matrix(X)
        D = X.shape[1]
        if isinstance(comoment, torch.Tensor) and comoment.is_cuda:
            for name, t, shape in (("mean", mean, (D,)), ("comoment", comoment, (D, D))):
                if t.dtype != torch.float64 or tuple(t.shape) != shape or not t.is_contiguous() or t.device != X.device:
                    raise DihalValueError(f"{name} must be a contiguous float64 tensor of shape {shape} on {X.device}")
            return self._covariance_update(X, count, mean, comoment, exact=False)
        mean_d, comoment_d = self._on(X, mean, torch.float64), self._on(X, comoment, torch.float64)
        count = self._covariance_update(X, count, mean_d, comoment_d, exact=False)
        mean[...] = mean_d.cpu().numpy()
        comoment[...] = comoment_d.cpu().numpy()
        return count

    def trace(self, cov) -> float:
        return float(self._torch.trace(cov))

    def top_eigenvalue(self, cov, precision: str = "float64") -> float:
        """Largest eigenvalue of a PSD CUDA matrix: Lanczos with full reorthogonalisation on the GPU,
        stopped by the residual test of the CPU kernel (a dense solver for small matrices)."""
        torch = self._torch
        D = cov.shape[0]
        if D <= _DENSE_EIGEN_MAX:
            return float(torch.linalg.eigvalsh(cov)[-1])
        steps = min(D, 300)
        V = torch.empty((steps + 1, D), dtype=torch.float64, device=cov.device)
        start = torch.rand(D, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 0.5
        V[0] = (start / start.norm()).to(cov.device)
        alpha = torch.empty(steps, dtype=torch.float64, device=cov.device)
        beta = torch.empty_like(alpha)
        theta = 0.0
        for j in range(steps):
            w = cov @ V[j]
            alpha[j] = w @ V[j]
            for _ in range(2):  # full reorthogonalisation, twice is enough
                w -= V[: j + 1].T @ (V[: j + 1] @ w)
            # Invariant subspace (breakdown, the CPU kernel's test b <= 1e-14 theta with max alpha <= theta):
            # continue with zero vectors, which leave the Ritz values of the leading block unchanged.
            b = w.norm()
            alive = b > 1e-14 * alpha[: j + 1].abs().max()
            beta[j] = torch.where(alive, b, torch.zeros_like(b))
            V[j + 1] = torch.where(alive, w / b.clamp(min=torch.finfo(torch.float64).tiny), torch.zeros_like(w))
            if (j + 1) % _LANCZOS_CHECK_EVERY == 0 or j + 1 == steps:
                theta, converged = _ritz(alpha[: j + 1].cpu().numpy(), beta[: j + 1].cpu().numpy(), 1e-12)
                if converged:
                    break
        return theta

    # ------------------------------------------------------------------ kNN
    def knn(self, X: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        idx, d2 = self.knn_device(X, k)
        return idx.cpu().numpy(), d2.cpu().numpy()

    def knn_device(self, X: Any, k: int):
        """Exact kNN as CUDA tensors: (indices int64 n x k, float64 squared distances n x k)."""
        torch, m = self._torch, self._m
        X = self._matrix(X)
        n, D = X.shape
        code = self._codes[X.dtype]
        idx = torch.empty((n, k), dtype=torch.int64, device=X.device)
        d2 = torch.empty((n, k), dtype=torch.float64, device=X.device)
        flags = None
        if m.knn_capacity(n, k) <= m.MAX_KNN_CANDIDATES:
            flags = torch.empty(n, dtype=torch.int32, device=X.device)
            ws = self._workspace(X, m.knn_workspace(n, D, k, code, self.use_cuvs))
            m.knn_candidates(
                X.data_ptr(),
                code,
                n,
                D,
                k,
                idx.data_ptr(),
                d2.data_ptr(),
                flags.data_ptr(),
                self.use_cuvs,
                ws.data_ptr(),
                ws.numel(),
                *self._launch(X),
            )
        # flags: rows whose candidates could not certify the answer (None: k beyond the kernel's lists)
        with _nvtx_range(f"dihal {self.name} kNN fallbacks"):
            stats = resolve_uncertified(
                X,
                k,
                flags,
                m.knn_capacity(n, k),
                idx,
                d2,
                lambda rows: self._exact_rows(X, k, rows, idx, d2),
                self.name,
            )
        _record(stats)
        torch.cuda.nvtx.mark(stats.summary())
        return idx, d2

    def _exact_rows(self, X, k: int, rows, idx, d2) -> None:
        """Rows' neighbours from exact float64 distances to all rows (stable sort: ties to the lower index)."""
        torch = self._torch
        n, D = X.shape
        for chunk in rows.split(max(1, _CHUNK_BYTES // (8 * n))):
            out = torch.empty((chunk.numel(), n), dtype=torch.float64, device=X.device)
            self._m.exact_sqdist_rows(
                X.data_ptr(),
                self._codes[X.dtype],
                n,
                D,
                chunk.data_ptr(),
                chunk.numel(),
                out.data_ptr(),
                *self._launch(X),
            )
            out[torch.arange(chunk.numel(), device=X.device), chunk] = float("inf")
            values, order = torch.sort(out, dim=1, stable=True)
            idx[chunk] = order[:, :k]
            d2[chunk] = values[:, :k]

    # ------------------------------------------------------------------ local curvature
    def local_top_eigenvalues(self, X: Any, idx: Any, precision: str = "float64") -> np.ndarray:
        torch = self._torch
        X = self._matrix(X)
        n, D = X.shape
        idx_d = self._indices(X, idx, "neighbour indices")
        if idx_d.ndim != 2 or idx_d.shape[0] != n:
            raise DihalValueError(f"indices must have shape (n, k) with n = {n}, got {tuple(idx_d.shape)}")
        k = idx_d.shape[1]
        out = torch.empty(n, dtype=torch.float64, device=X.device)
        if k + 1 <= self._m.MAX_LOCAL_POINTS:
            self._m.local_top_eigenvalues(
                X.data_ptr(), self._codes[X.dtype], n, D, idx_d.data_ptr(), k, out.data_ptr(), *self._launch(X)
            )
        else:  # large neighbourhoods: batched float64 Gram matrices and a batched eigensolver
            points = torch.cat([torch.arange(n, device=X.device)[:, None], idx_d], dim=1)
            step = max(1, _CHUNK_BYTES // (8 * (k + 1) * D))
            for s in range(0, n, step):
                N = X[points[s : s + step]].double()
                N = N - N.mean(dim=1, keepdim=True)
                out[s : s + step] = torch.linalg.eigvalsh(N @ N.transpose(1, 2))[:, -1] / (k + 1)
        return out.cpu().numpy()

    # ------------------------------------------------------------------ monotonicity
    def pair_quotients(
        self, X: Any, mean: Any, cov: Any, lam: float, pi: Any, pj: Any, precision: str = "float64"
    ) -> np.ndarray:
        """Pair Rayleigh quotients; the mean is not needed (differences cancel it)."""
        torch = self._torch
        X = self._matrix(X)
        n, D = X.shape
        a, b = self._indices(X, pi, "pair indices"), self._indices(X, pj, "pair indices")
        if a.ndim != 1 or a.shape != b.shape or a.numel() == 0:
            raise DihalValueError("pair index arrays must be non-empty, 1-D and of equal length")
        cov_d = self._on(X, cov, torch.float64)
        L, info = torch.linalg.cholesky_ex(cov_d + lam * torch.eye(D, dtype=torch.float64, device=X.device))
        if int(info) != 0:
            raise DihalValueError(f"regularised covariance is not positive definite (cuSOLVER potrf info={int(info)})")
        L = L.contiguous()  # row-major lower factor, held until the kernels are queued
        P = a.numel()
        out = torch.empty(P, dtype=torch.float64, device=X.device)
        ws = self._workspace(X, self._m.pair_workspace(D, P))
        self._m.pair_quotients(
            X.data_ptr(),
            self._codes[X.dtype],
            n,
            D,
            L.data_ptr(),
            a.data_ptr(),
            b.data_ptr(),
            P,
            out.data_ptr(),
            ws.data_ptr(),
            ws.numel(),
            *self._launch(X),
        )
        return out.cpu().numpy()


def _nvtx_range(message: str):
    """An NVTX range around the kNN fallbacks (seen in Nsight Systems next to the kernel's ranges)."""
    import torch

    return torch.cuda.nvtx.range(message) if torch.cuda.is_available() else contextlib.nullcontext()


def _ritz(alpha: np.ndarray, beta: np.ndarray, rel_tol: float) -> tuple[float, bool]:
    """Top Ritz value of the Lanczos tridiagonal and whether it has converged (residual |b_m s_m|)."""
    T = np.diag(alpha) + np.diag(beta[:-1], 1) + np.diag(beta[:-1], -1)
    values, vectors = np.linalg.eigh(T)
    theta = float(values[-1])
    residual = abs(beta[-1] * vectors[-1, -1])
    return theta, bool(beta[-1] <= 1e-14 * max(abs(theta), 1e-300) or residual <= rel_tol * abs(theta))
