"""Checks a first GPU run needs beyond the test suite (bench/gpu_check.sh runs them).

    python tools/gpu_first_run.py smoke     # every kernel once vs the reference; the kNN kernel (cuda, and cuvs
                                            # where it runs) must itself certify >= 99 % of ordinary rows, each
                                            # equal to the reference (backend_cuda.last_knn_stats)
    python tools/gpu_first_run.py streams   # multi-tile kNN, covariance (float64 SYRK, float32 / float16 GEMM
                                            # with the float16 block scale) and local eigenvalues (block Jacobi)
                                            # on three side streams at once vs the CPU reference (run it under
                                            # compute-sanitizer memcheck / racecheck)
    python tools/gpu_first_run.py large     # n * D > 2^31 bfloat16 rows: kNN and covariance, time and peak memory
    python tools/gpu_first_run.py guard     # the device guard: a kernel call from a fresh thread leaves its
                                            # current context as it was and creates none on an unused device

Each prints one JSON line with what it measured and exits non-zero when a result differs from the reference.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import numpy as np
import torch

import dihal_fast as df
from dihal_fast import reference as ref

# The covariance rows of the streams check: (name, dtype). float64 blocks take the float64 SYRK; float32 and
# float16 blocks are centred in float32 and multiplied by a float32 GEMM (PEDANTIC). "float16 wide" rows lie at
# +-6e4 (90 % at -6e4 in each column), so |x - block mean| reaches about 1.1e5: past 2^15 the block is scaled by a
# power of two before its centred values are stored.
COVARIANCE_ROWS = (("float64", "float64"), ("float32", "float32"), ("float16", "float16"), ("float16 wide", "float16"))
# Largest |covariance error| / largest |covariance| accepted, against the float64 covariance of the rows as
# stored: the centred values of float16 / bfloat16 / float32 rows carry one float32 rounding (2^-24 relative),
# plus the float32 sums. A host model of the device arithmetic (tests/test_gpu_check_tools.py) stays 10x or more
# below each.
COVARIANCE_TOLERANCE = {"float64": 1e-9, "float32": 1e-5, "float16": 1e-5, "bfloat16": 1e-5}
LOCAL_EIGEN_K = (16, 63)  # 63: the largest neighbourhood of the block kernel (MAX_LOCAL_POINTS = 64 points)


def covariance_rows(name: str, n: int, dim: int = 16, seed: int = 1) -> np.ndarray:
    """Rows of one covariance case of ``COVARIANCE_ROWS``, in its dtype (repeated rows: several exact ties)."""
    rng = np.random.default_rng(seed)
    dtype = dict(COVARIANCE_ROWS)[name]
    if name == "float16 wide":
        Y = np.where(rng.random((n, dim)) < 0.1, 6e4, -6e4) + 100.0 * rng.standard_normal((n, dim))
        return np.clip(Y, -65000.0, 65000.0).astype(dtype)
    return np.repeat(rng.standard_normal((n // 4 + 1, dim)), 4, axis=0)[:n].astype(dtype)


def covariance_error(Y: np.ndarray, mean: np.ndarray, sigma: np.ndarray) -> float:
    """max(largest |covariance error| / largest |covariance|, largest |mean error| / largest |x|) against the
    float64 statistics of ``Y`` as stored."""
    mean_ref, sigma_ref = ref.covariance(Y)
    cov_err = np.abs(np.asarray(sigma) - sigma_ref).max() / np.abs(sigma_ref).max()
    mean_err = np.abs(np.asarray(mean) - mean_ref).max() / np.abs(Y.astype(np.float64)).max()
    return float(max(cov_err, mean_err))


def local_eigen_rows(n: int, D: int, seed: int = 2) -> np.ndarray:
    """float32 rows for the local-eigenvalue kernel: low-rank structure plus noise (D = 50 leaves a ragged column
    chunk of the kernel's 32- and 16-column chunks)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 4)) @ rng.standard_normal((4, D)) + 0.1 * rng.standard_normal((n, D))).astype(
        np.float32
    )


def run_threads(*jobs) -> None:
    """Run ``jobs`` on fresh host threads at once and wait; the first exception of a job is raised here."""
    errors: list[BaseException] = []

    def wrapped(job) -> None:
        try:
            job()
        except BaseException as exc:  # re-raised in the caller's thread below
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def ordinary_rows(n: int, D: int, seed: int = 3) -> np.ndarray:
    """Low-rank rows plus noise with a common offset, as hidden states are: the kNN kernel certifies such rows."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 8)) @ rng.standard_normal((8, D)) + 0.05 * rng.standard_normal((n, D))
    return X + 3.0 * rng.standard_normal(D)


def smoke(n: int, D: int, k: int) -> dict:
    """Each kernel once on its own against the float64 reference, and the certified share of the kNN kernel: the
    rows it certifies itself (not the float64 / exact fallbacks) must be >= 99 % of ordinary rows and each equal
    to the reference, for every input dtype and for cuvs where it runs."""
    import os

    from dihal_fast.geometry import backend_cuda
    from dihal_fast.geometry.backends import get_backend

    X = ordinary_rows(n, D)
    problems: list[str] = []
    shares: dict[str, float] = {}
    backends = ["cuda"]
    try:
        get_backend("cuvs", "cuda")
        backends.append("cuvs")
    except df.BackendUnavailable as exc:
        if os.environ.get("DIHAL_REQUIRE_CUVS") == "1":
            problems.append(f"cuvs cannot run: {exc}")
    for backend in backends:
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            Xd = torch.from_numpy(X).to(dtype)
            stored = Xd.double().numpy()  # the reference sees the rows as stored in dtype
            ref_idx, ref_d2 = ref.knn(stored, k)
            idx, d2 = df.knn(Xd.cuda(), k, backend=backend)
            stats = backend_cuda.last_knn_stats()
            name = f"{backend} {str(dtype).removeprefix('torch.')}"
            if stats is None or stats.backend != backend:
                problems.append(f"{name}: no certified-share record of the call")
                continue
            shares[name] = round(stats.kernel_share, 4)
            problems += [f"{name}: {p}" for p in backend_cuda.certified_share_problems(stats, idx, d2, ref_idx, ref_d2)]
    ops = get_backend("cuda", "cuda")
    Xc = torch.from_numpy(X).cuda()
    mean, cov = ops.covariance(Xc)
    mean_ref, cov_ref = ref.covariance(X)
    if not np.allclose(cov.cpu().numpy(), cov_ref, rtol=1e-9, atol=1e-12 * np.abs(cov_ref).max()):
        problems.append("float64 covariance differs from the reference")
    lam = ops.top_eigenvalue(cov)
    if not abs(lam - np.linalg.eigvalsh(cov_ref)[-1]) <= 1e-9 * abs(lam):
        problems.append(f"top eigenvalue {lam} differs from the reference")
    nbrs = ref.knn(X, k)[0]
    local = ops.local_top_eigenvalues(Xc, nbrs)
    local_ref = ref.local_top_eigenvalues(X, nbrs)
    if not np.allclose(local, local_ref, rtol=1e-9, atol=1e-12 * local_ref.max()):
        problems.append("local top eigenvalues differ from the reference")
    pi, pj = np.arange(0, n - 1, 2), np.arange(1, n, 2)
    quotients = ops.pair_quotients(Xc, mean_ref, cov_ref, 1e-3, pi, pj)
    quotients_ref = get_backend("reference").pair_quotients(X, mean_ref, cov_ref, 1e-3, pi, pj)
    if not np.allclose(quotients, quotients_ref, rtol=1e-9):
        problems.append("pair quotients differ from the reference")
    return {
        "check": "smoke",
        "n": n,
        "D": D,
        "k": k,
        "kernel_certified_share": shares,
        "problems": problems,
        "ok": not problems,
    }


def streams(n: int, D: int, k: int) -> dict:
    """kNN (n > one 4096-row tile, ragged last tile), streaming covariances (several row blocks each, float64 SYRK,
    float32 / float16 GEMM, the float16 block scale) and local top eigenvalues (the block-Jacobi kernel) on three
    side streams from three host threads at the same time (one cuBLAS handle per stream), each compared with the
    CPU reference after all finish."""
    from dihal_fast.geometry.backends import get_backend

    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 8)) @ rng.standard_normal((8, D)) + 0.05 * rng.standard_normal((n, D)) + 2.0
    X[n - 300 :] = X[:300]  # exact duplicates across tiles
    Xk = torch.from_numpy(X.astype(np.float32)).cuda()
    cov_rows = {name: covariance_rows(name, n) for name, _ in COVARIANCE_ROWS}
    cov_gpu = {name: torch.from_numpy(Y).cuda() for name, Y in cov_rows.items()}
    Z = local_eigen_rows(512, 50)
    Zc = torch.from_numpy(Z).cuda()
    neighbours = {kk: ref.knn(Z, kk)[0] for kk in LOCAL_EIGEN_K}
    ops = get_backend("cuda", "cuda")
    s1, s2, s3 = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    start = threading.Barrier(3, timeout=60)  # a job that fails before it waits breaks the barrier, no hang
    results: dict[str, object] = {}

    def run_knn() -> None:
        with torch.cuda.stream(s1):
            start.wait()
            results["knn"] = df.knn(Xk, k, backend="cuda")

    def run_covariance() -> None:
        with torch.cuda.stream(s2):
            start.wait()
            for name, Yc in cov_gpu.items():
                cov = df.StreamingCovariance(Yc.shape[1], backend="cuda")
                for block in Yc.split(1500):
                    cov.update(block)
                results[f"cov {name}"] = (cov.mean, cov.covariance)

    def run_local_eigen() -> None:
        with torch.cuda.stream(s3):
            start.wait()
            for kk, idx in neighbours.items():
                results[f"eigen {kk}"] = ops.local_top_eigenvalues(Zc, idx)

    run_threads(run_knn, run_covariance, run_local_eigen)
    torch.cuda.synchronize()
    knn_idx, knn_d2 = results["knn"]
    ridx, rd2 = ref.knn(Xk.cpu().numpy(), k)
    knn_ok = bool(np.array_equal(np.asarray(knn_idx), ridx)) and bool(np.allclose(knn_d2, rd2, rtol=1e-5))
    cov_errors = {name: covariance_error(cov_rows[name], *results[f"cov {name}"]) for name, _ in COVARIANCE_ROWS}
    cov_ok = all(cov_errors[name] <= COVARIANCE_TOLERANCE[dtype] for name, dtype in COVARIANCE_ROWS)
    # float64 rows: also element by element, exact to float64 rounding
    mean64, sigma64 = results["cov float64"]
    mean_ref64, sigma_ref64 = ref.covariance(cov_rows["float64"])
    cov_ok &= bool(np.allclose(np.asarray(sigma64), sigma_ref64, rtol=1e-9, atol=1e-12))
    cov_ok &= bool(np.allclose(np.asarray(mean64), mean_ref64, rtol=1e-12, atol=1e-12))
    eigen_errors = {}
    for kk, idx in neighbours.items():
        lam_ref = ref.local_top_eigenvalues(Z, idx)
        eigen_errors[kk] = float(np.abs(np.asarray(results[f"eigen {kk}"]) - lam_ref).max() / lam_ref.max())
    eigen_ok = all(err <= 1e-9 for err in eigen_errors.values())
    return {
        "check": "streams",
        "n": n,
        "D": D,
        "k": k,
        "knn_ok": knn_ok,
        "covariance_errors": {name: f"{err:.2e}" for name, err in cov_errors.items()},
        "covariance_ok": cov_ok,
        "local_eigen_errors": {str(kk): f"{err:.2e}" for kk, err in eigen_errors.items()},
        "local_eigen_ok": eigen_ok,
        "ok": knn_ok and cov_ok and eigen_ok,
    }


def large(n: int, D: int, k: int, sample: int = 16) -> dict:
    """kNN and covariance on n x D bfloat16 rows with n * D > 2^31 (int64 index arithmetic), timed, with the peak
    of torch's allocator; ``sample`` rows of the kNN checked against exact float64 distances to all rows."""
    assert n * D > 2**31, "the smoke needs n * D > 2^31"
    g = torch.Generator(device="cuda").manual_seed(0)
    X = (
        torch.randn(n, 64, device="cuda", generator=g) @ torch.randn(64, D, device="cuda", generator=g)
        + 0.1 * torch.randn(n, D, device="cuda", generator=g)
    ).to(torch.bfloat16)
    X[n - 1000 :] = X[:1000]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    idx, _ = df.knn(X, k, backend="cuda")
    torch.cuda.synchronize()
    t_knn = time.perf_counter() - t0
    peak_knn = torch.cuda.max_memory_allocated() - base
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:sample].tolist() + [n - 1]
    ok = True
    for i in rows:
        d = torch.cat([((X[r0 : r0 + 8192].double() - X[i].double()) ** 2).sum(dim=1) for r0 in range(0, n, 8192)])
        d[i] = float("inf")
        order = torch.sort(d, stable=True).indices[:k].cpu().numpy()
        ok &= bool(np.array_equal(np.asarray(idx[i]), order))
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    cov = df.StreamingCovariance(D, backend="cuda")
    cov.update(X)
    sigma = cov.covariance
    torch.cuda.synchronize()
    t_cov = time.perf_counter() - t0
    peak_cov = torch.cuda.max_memory_allocated() - base
    finite = bool(torch.isfinite(torch.as_tensor(sigma)).all())
    return {
        "check": "large",
        "n": n,
        "D": D,
        "k": k,
        "elements": n * D,
        "input_gb": X.numel() * 2 / 1e9,
        "knn_s": round(t_knn, 2),
        "knn_peak_extra_gb": round(peak_knn / 1e9, 2),
        "knn_rows_ok": ok,
        "covariance_s": round(t_cov, 2),
        "covariance_peak_extra_gb": round(peak_cov / 1e9, 2),
        "covariance_finite": finite,
        "ok": ok and finite,
    }


class Driver:
    """The CUDA driver API calls the guard check reads (libcuda.so.1 through ctypes; none creates a context)."""

    def __init__(self) -> None:
        import ctypes

        self._c = ctypes
        self._lib = ctypes.CDLL("libcuda.so.1")
        self._call("cuInit", 0)

    def _call(self, name: str, *args) -> None:
        rc = getattr(self._lib, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name} returned CUDA driver error {rc}")

    def current_context(self) -> int:
        """The calling thread's current context (0: none)."""
        ctx = self._c.c_void_p()
        self._call("cuCtxGetCurrent", self._c.byref(ctx))
        return ctx.value or 0

    def primary_active(self, ordinal: int) -> bool:
        """Whether the primary context of device ``ordinal`` exists (cuDevicePrimaryCtxGetState)."""
        dev, flags, active = self._c.c_int(), self._c.c_uint(), self._c.c_int()
        self._call("cuDeviceGet", self._c.byref(dev), ordinal)
        self._call("cuDevicePrimaryCtxGetState", dev, self._c.byref(flags), self._c.byref(active))
        return bool(active.value)


def guard(k: int = 8) -> dict:
    """The device guard of the kernels (csrc/cuda/common.cuh), for device ``target`` (1 when there are two devices,
    else 0): the binding called from a fresh thread, whose current context is none, leaves it none; the binding and
    the whole public ``df.knn`` path, each from a fresh thread, create no primary context on another device; with
    two devices, the binding called from a thread whose current context is device 0's leaves device 0's."""
    from dihal_fast import _native

    driver = Driver()
    count = torch.cuda.device_count()
    target = 1 if count >= 2 else 0
    module = _native.cuda_module()
    Z = local_eigen_rows(256, 50)
    idx = ref.knn(Z, k)[0]
    lam_ref = ref.local_top_eigenvalues(Z, idx)
    device = torch.device("cuda", target)
    Zc = torch.from_numpy(Z).to(device)
    idx_c = torch.from_numpy(idx).to(device)
    outputs = [torch.empty(len(Z), dtype=torch.float64, device=device) for _ in range(2)]
    stream = torch.cuda.Stream(device=device)
    torch.cuda.synchronize(device)
    contexts: dict[str, int] = {}
    results: dict[str, object] = {}

    def raw_call(tag: str, out: torch.Tensor) -> None:
        """The binding alone: no torch call in this thread before or around it."""
        contexts[f"{tag} before"] = driver.current_context()
        module.local_top_eigenvalues(
            Zc.data_ptr(), 2, len(Z), Z.shape[1], idx_c.data_ptr(), k, out.data_ptr(), target, stream.cuda_stream
        )
        contexts[f"{tag} after"] = driver.current_context()

    def public_call() -> None:
        results["knn"] = df.knn(Zc, k, backend="cuda")

    def from_device_0() -> None:
        torch.cuda.set_device(0)
        torch.zeros(1, device="cuda:0")  # device 0 used on purpose: its context is this thread's current one
        raw_call("device 0 current", outputs[1])

    def in_fresh_thread(job) -> list[bool]:
        run_threads(job)
        return [driver.primary_active(i) for i in range(count)]

    active_before = [driver.primary_active(i) for i in range(count)]
    active_raw = in_fresh_thread(lambda: raw_call("fresh thread", outputs[0]))
    active_public = in_fresh_thread(public_call)
    if count >= 2:
        in_fresh_thread(from_device_0)
    torch.cuda.synchronize(device)
    others = [i for i in range(count) if i != target]
    fresh_ok = contexts["fresh thread before"] == 0 and contexts["fresh thread after"] == 0
    restored_ok = count < 2 or contexts["device 0 current after"] == contexts["device 0 current before"] != 0
    raw_untouched_ok = all(active_raw[i] == active_before[i] for i in others)
    public_untouched_ok = all(active_public[i] == active_before[i] for i in others)
    used = outputs if count >= 2 else outputs[:1]
    values_ok = all(np.allclose(out.cpu().numpy(), lam_ref, rtol=1e-9, atol=0) for out in used)
    values_ok &= bool(np.array_equal(np.asarray(results["knn"][0]), idx))
    return {
        "check": "guard",
        "devices": count,
        "target": target,
        "contexts": {tag: hex(ctx) for tag, ctx in contexts.items()},
        "primary_active": {"before": active_before, "after binding": active_raw, "after df.knn": active_public},
        "fresh_thread_ok": fresh_ok,
        "previous_context_restored_ok": restored_ok,
        "binding_creates_no_context_ok": raw_untouched_ok,
        "df_knn_creates_no_context_ok": public_untouched_ok,
        "values_ok": values_ok,
        "ok": fresh_ok and restored_ok and raw_untouched_ok and public_untouched_ok and values_ok,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=["smoke", "streams", "large", "guard"])
    parser.add_argument("--n", type=int, default=None, help="rows (smoke: 6000, streams: 4396, large: 270000)")
    parser.add_argument("--dim", type=int, default=None, help="columns (smoke: 64, streams: 48, large: 8192)")
    parser.add_argument("--k", type=int, default=8)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"check": args.check, "ok": False, "reason": "no CUDA device"}))
        return 1
    if args.check == "smoke":
        result = smoke(args.n or 6000, args.dim or 64, args.k)
    elif args.check == "streams":
        result = streams(args.n or 4396, args.dim or 48, args.k)
    elif args.check == "guard":
        result = guard(args.k)
    else:
        result = large(args.n or 270000, args.dim or 8192, args.k)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
