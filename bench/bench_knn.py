"""How fast is exact kNN against FAISS (IndexFlatL2) and scikit-learn, and against the GEMM rate?

The distance product of an n x D matrix with itself costs 2 n^2 D flops; the floor is that over the
machine's float32 GEMM rate.
"""
from __future__ import annotations

import argparse

import numpy as np
from _common import best_time, report, rows_figure, sgemm_rate, table, target

import dihal_fast as df


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20000, help="rows")
    parser.add_argument("--dim", type=int, default=256, help="columns")
    parser.add_argument("--k", type=int, default=16, help="neighbours")
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions (best is kept)")
    args = parser.parse_args()

    import faiss

    rng = np.random.default_rng(0)
    X = (rng.standard_normal((args.n, 32)) @ rng.standard_normal((32, args.dim)) + 0.1 * rng.standard_normal((args.n, args.dim))).astype(np.float32)

    t_ours = best_time(lambda: df.knn(X, args.k), args.repeat)

    def run_faiss():
        index = faiss.IndexFlatL2(args.dim)
        index.add(X)
        return index.search(X, args.k + 1)  # includes the point itself

    t_faiss = best_time(run_faiss, args.repeat)
    ours_idx = df.knn(X, args.k)[0]
    faiss_idx = run_faiss()[1][:, 1:]
    agreement = float((np.sort(ours_idx, 1) == np.sort(faiss_idx, 1)).mean())
    rate = sgemm_rate()
    floor = 2.0 * args.n**2 * args.dim / (rate * 1e9)
    rows = [
        ["dihal_fast.knn (exact, float64 re-rank)", t_ours, 1.0, floor / t_ours],
        ["faiss IndexFlatL2", t_faiss, t_faiss / t_ours, floor / t_faiss],
    ]
    body = table(["method", "seconds", "time / ours", "GEMM floor / time"], rows)
    body += (
        f"\n\nn={args.n}, D={args.dim}, k={args.k}, float32. Machine sgemm rate {rate:.0f} GFLOP/s, "
        f"GEMM floor {floor:.3f} s. Neighbour-set agreement with FAISS: {agreement:.4f} "
        "(FAISS ranks in float32; ours is exact in float64). Target: time <= FAISS time."
    )
    report("kNN: dihal_fast vs FAISS", body, question="knn_vs_faiss",
           figures={"timings": rows_figure(["method", "seconds", "time / ours", "GEMM floor / time"], rows),
                    "n": args.n, "dim": args.dim, "k": args.k, "sgemm_gflops": rate, "gemm_floor_s": floor,
                    "agreement_with_faiss": agreement},
           targets=[target("time <= FAISS IndexFlatL2 time", f"{t_ours:.3g} s vs {t_faiss:.3g} s", t_ours <= t_faiss)])


if __name__ == "__main__":
    main()
