"""Checks a first GPU run needs beyond the test suite (bench/gpu_check.sh runs them).

    python tools/gpu_first_run.py streams   # multi-tile kNN and covariance on two side streams at once vs the
                                            # CPU reference (run it under compute-sanitizer memcheck / racecheck)
    python tools/gpu_first_run.py large     # n * D > 2^31 bfloat16 rows: kNN and covariance, time and peak memory

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


def streams(n: int, D: int, k: int) -> dict:
    """kNN (n > one 4096-row tile, ragged last tile) and a streaming covariance (several row blocks) on two side
    streams from two host threads at the same time (one cuBLAS handle per stream), each compared with the CPU
    reference after both finish."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 8)) @ rng.standard_normal((8, D)) + 0.05 * rng.standard_normal((n, D)) + 2.0
    X[n - 300 :] = X[:300]  # exact duplicates across tiles
    Xk = torch.from_numpy(X.astype(np.float32)).cuda()
    Y = np.repeat(rng.standard_normal((n // 4, 16)), 4, axis=0)
    Yc = torch.from_numpy(Y).cuda()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    start = threading.Barrier(2)
    results: dict[str, object] = {}

    def run_knn() -> None:
        with torch.cuda.stream(s1):
            start.wait()
            results["knn"] = df.knn(Xk, k, backend="cuda")

    def run_covariance() -> None:
        with torch.cuda.stream(s2):
            cov = df.StreamingCovariance(16, backend="cuda")
            start.wait()
            for block in Yc.split(1500):
                cov.update(block)
            results["cov"] = (cov.mean, cov.covariance)

    threads = [threading.Thread(target=run_knn), threading.Thread(target=run_covariance)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    knn_idx, knn_d2 = results["knn"]
    mean, sigma = results["cov"]
    ridx, rd2 = ref.knn(Xk.cpu().numpy(), k)
    knn_ok = bool(np.array_equal(np.asarray(knn_idx), ridx)) and bool(np.allclose(knn_d2, rd2, rtol=1e-5))
    Yr = Y - Y.mean(axis=0)
    sigma_ref = Yr.T @ Yr / len(Y)
    cov_ok = bool(np.allclose(np.asarray(sigma), sigma_ref, rtol=1e-9, atol=1e-12)) and bool(
        np.allclose(np.asarray(mean), Y.mean(axis=0), rtol=1e-12, atol=1e-12)
    )
    return {
        "check": "streams",
        "n": n,
        "D": D,
        "k": k,
        "knn_ok": knn_ok,
        "covariance_ok": cov_ok,
        "ok": knn_ok and cov_ok,
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=["streams", "large"])
    parser.add_argument("--n", type=int, default=None, help="rows (streams: 4396, large: 270000)")
    parser.add_argument("--dim", type=int, default=None, help="columns (streams: 48, large: 8192)")
    parser.add_argument("--k", type=int, default=8)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"check": args.check, "ok": False, "reason": "no CUDA device"}))
        return 1
    if args.check == "streams":
        result = streams(args.n or 4396, args.dim or 48, args.k)
    else:
        result = large(args.n or 270000, args.dim or 8192, args.k)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
