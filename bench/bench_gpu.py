"""How fast are the CUDA kernels against their floors, torch and cuVS? (needs a CUDA GPU)

Each kernel is timed (CUDA-synchronised wall clock, best of --repeat after a warm-up) against
  * its floor: the larger of its FLOPs over the GEMM rate measured here for its precision and its
    bytes over the device-to-device copy bandwidth measured here;
  * what a researcher would write in torch (cdist + topk, torch.cov, eigvalsh, cholesky + solve);
  * cuVS brute force (backend="cuvs") where this build has it.
Prints a table and writes it with the command as bench/results/gpu_kernels.json (see bench/README.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _common import report, rows_figure, table  # noqa: E402

import dihal_fast as df  # noqa: E402
from dihal_fast.geometry.backends import get_backend  # noqa: E402
from dihal_fast.reference import draw_pairs  # noqa: E402


def gpu_time(fn, repeat: int) -> float:
    """Best wall time (s) of ``repeat`` synchronised calls after one warm-up."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def gemm_rate(dtype: torch.dtype, size: int, repeat: int) -> float:
    """Measured matrix-product rate in FLOP/s (TF32 off: float32 means float32)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    A = torch.randn(size, size, device="cuda").to(dtype)
    return 2.0 * size**3 / gpu_time(lambda: A @ A, repeat)


def copy_bandwidth(repeat: int) -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read and written."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2.0 * src.numel() / gpu_time(lambda: dst.copy_(src), repeat)


def floor(flops: float, rate: float, nbytes: float, bandwidth: float) -> float:
    return max(flops / rate, nbytes / bandwidth)


def data(n: int, D: int, dtype: torch.dtype, rank: int = 64) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(0)
    low = torch.randn(n, rank, device="cuda", generator=g) @ torch.randn(rank, D, device="cuda", generator=g)
    return (low + 0.1 * torch.randn(n, D, device="cuda", generator=g)).to(dtype)


def torch_knn(X: torch.Tensor, k: int, block: int = 4096) -> torch.Tensor:
    """cdist + topk in blocks of queries (what one would write in torch)."""
    out = []
    for s in range(0, X.shape[0], block):
        d = torch.cdist(X[s : s + block].float(), X.float())
        d[torch.arange(d.shape[0], device="cuda"), torch.arange(s, s + d.shape[0], device="cuda")] = float("inf")
        out.append(d.topk(k, largest=False).indices)
    return torch.cat(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions per measurement (best is kept)")
    parser.add_argument("--dim", type=int, default=4096, help="hidden size D of the large cases")
    parser.add_argument("--tokens", type=int, default=32768, help="rows per covariance update")
    parser.add_argument("--knn-rows", type=int, default=20000, help="rows of the large kNN case")
    parser.add_argument("--k", type=int, default=16, help="neighbours")
    args = parser.parse_args()

    info = df.build_info()["backends"]["cuda"]
    if not info["available"]:
        print(f"CUDA backend unavailable: {info['reason']}", file=sys.stderr)
        return 2
    ops = get_backend("cuda")
    cuvs = get_backend("cuvs") if df.build_info()["backends"]["cuvs"]["available"] else None
    r, D, k = args.repeat, args.dim, args.k
    rates = {
        dt: gemm_rate(dt, 8192 if dt != torch.float64 else 4096, r)
        for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    }
    bandwidth = copy_bandwidth(r)
    rows = []

    def add(kernel, case, ours, floor_s, torch_s=None, cuvs_s=None):
        rows.append(
            [
                kernel,
                case,
                1e3 * ours,
                1e3 * floor_s,
                floor_s / ours,
                "" if torch_s is None else 1e3 * torch_s,
                "" if torch_s is None else torch_s / ours,
                "" if cuvs_s is None else 1e3 * cuvs_s,
            ]
        )

    # Streaming covariance update: SYRK flops n D^2 at the input type's rate, input bytes read once.
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        X = data(args.tokens, D, dt)
        mean = torch.zeros(D, dtype=torch.float64, device="cuda")
        M = torch.zeros((D, D), dtype=torch.float64, device="cuda")
        ours = gpu_time(lambda: ops.covariance_update(X, 0, mean, M), r)
        fl = floor(float(args.tokens) * D * D, rates[dt], X.numel() * X.element_size(), bandwidth)
        theirs = gpu_time(lambda: torch.cov(X.float().T, correction=0), r)
        add("covariance_update", f"{args.tokens} x {D} {str(dt)[6:]}", ours, fl, theirs)

    # Exact kNN: the candidate GEMM 2 n^2 D runs in float32 (float64 re-rank on top).
    for n, dim, dt in ((args.knn_rows, 256, torch.float32), (3000, D, torch.float32), (3000, D, torch.bfloat16)):
        X = data(n, dim, dt)
        ours = gpu_time(lambda: ops.knn_device(X, k), r)
        fl = floor(2.0 * n * n * dim, rates[torch.float32], X.numel() * X.element_size(), bandwidth)
        theirs = gpu_time(lambda: torch_knn(X, k), r)
        cuvs_s = gpu_time(lambda: cuvs.knn_device(X, k), r) if cuvs else None
        add("knn (exact)", f"{n} x {dim} {str(dt)[6:]}, k={k}", ours, fl, theirs, cuvs_s)

    # Local top eigenvalues: gather (k+1) rows per point; Gram flops 2 (k+1)^2 D in float64.
    n = 20000
    X = data(n, D, torch.bfloat16)
    idx = torch.randint(0, n, (n, k), device="cuda")
    ours = gpu_time(lambda: ops.local_top_eigenvalues(X, idx), r)
    fl = floor(2.0 * n * (k + 1) ** 2 * D, rates[torch.float64], n * (k + 1) * D * X.element_size(), bandwidth)

    def torch_local():
        N = X[torch.cat([torch.arange(n, device="cuda")[:, None], idx], 1)[:2000]].double()
        N = N - N.mean(1, keepdim=True)
        return torch.linalg.eigvalsh(N @ N.transpose(1, 2))[:, -1]

    theirs = gpu_time(torch_local, r) * n / 2000
    add("local_top_eigenvalues", f"{n} x {D} bf16, k={k}", ours, fl, theirs)

    # Pair quotients: Cholesky D^3/3 + triangular solves P D^2, float64.
    X = data(3000, D, torch.float32)
    mean, cov = ops.covariance(X)
    lam = 1e-3 * float(torch.trace(cov)) / D
    pi, pj, _ = draw_pairs(3000, 10000, 0)
    ours = gpu_time(lambda: ops.pair_quotients(X, mean, cov, lam, pi, pj), r)
    fl = floor(D**3 / 3 + 10000.0 * D * D, rates[torch.float64], 2 * 10000 * D * 4, bandwidth)
    Pi, Pj = torch.from_numpy(pi).cuda(), torch.from_numpy(pj).cuda()

    def torch_pairs():
        L = torch.linalg.cholesky(cov + lam * torch.eye(D, dtype=torch.float64, device="cuda"))
        d = (X[Pi] - X[Pj]).double()
        y = torch.linalg.solve_triangular(L, d.T, upper=False)
        return (y * y).sum(0) / (d * d).sum(1)

    add("pair_quotients", f"3000 x {D} f32, 10000 pairs", ours, fl, gpu_time(torch_pairs, r))

    # Top eigenvalue of the covariance (Lanczos on the GPU) against a dense eigensolver.
    ours = gpu_time(lambda: ops.top_eigenvalue(cov), r)
    fl = floor(0.0, 1.0, cov.numel() * 8.0, bandwidth)  # at least one pass over the matrix
    add("top_eigenvalue", f"{D} x {D} f64", ours, fl, gpu_time(lambda: torch.linalg.eigvalsh(cov)[-1].item(), 1))

    # End to end: one layer's proxies.
    for dt in (torch.float32, torch.bfloat16):
        X = data(3000, D, dt)
        ours = gpu_time(lambda: df.geometry_proxies(X, backend="cuda"), r)
        add("geometry_proxies", f"3000 x {D} {str(dt)[6:]}", ours, float("nan"))

    header = ["kernel", "case", "ours ms", "floor ms", "floor / ours", "torch ms", "torch / ours", "cuVS ms"]
    gpu = torch.cuda.get_device_name()
    body = table(header, rows) + (
        f"\n\nGPU: {gpu}; measured GEMM rates (TFLOP/s): "
        + ", ".join(f"{str(dt)[6:]} {v / 1e12:.1f}" for dt, v in rates.items())
        + f"; copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write). torch local eigenvalues timed on 2,000 "
        "points and scaled. geometry_proxies: k=16, 10,000 pairs (no floor: a sum of the rows above)."
    )
    report(
        f"CUDA kernels against their floors, torch and cuVS ({gpu})",
        body,
        question="gpu_kernels",
        figures={
            "kernels": rows_figure(header, rows),
            "gpu": gpu,
            "copy_bandwidth_tb_s": bandwidth / 1e12,
            "gemm_tflop_s": {str(dt)[6:]: v / 1e12 for dt, v in rates.items()},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
