"""How close does StreamingCovariance.update come to the machine's sgemm rate?

A covariance update of b rows of dimension D does the work of a SYRK, b*D*(D+1) flops; we report
that over the measured time against the machine's float32 GEMM rate, and against the plain
alternatives (NumPy float64 X^T X on centred data, torch.cov).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from _common import best_time, report, rows_figure, sgemm_rate, table, target

import dihal_fast as df


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=16384, help="rows per update call")
    parser.add_argument("--dims", type=int, nargs="+", default=[1024, 2048, 4096], help="dimensions to test")
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions (best is kept)")
    args = parser.parse_args()

    rate = sgemm_rate()
    rows = []
    rng = np.random.default_rng(0)
    for D in args.dims:
        X = rng.standard_normal((args.rows, D), dtype=np.float32) + 3.0
        acc = df.StreamingCovariance(D)
        t_ours = best_time(lambda: acc.update(X), args.repeat)
        flops = args.rows * D * (D + 1)
        t_numpy = best_time(lambda: (lambda Xc: Xc.T @ Xc)(X.astype(np.float64) - X.mean(0, dtype=np.float64)), 1)
        tX = torch.from_numpy(X)
        t_torch = best_time(lambda: torch.cov(tX.T, correction=0), args.repeat)
        rows.append([D, t_ours, flops / t_ours / 1e9, flops / t_ours / 1e9 / rate, t_numpy / t_ours, t_torch / t_ours])
    header = [
        "D",
        "update s",
        "GFLOP/s (SYRK flops)",
        "fraction of sgemm rate",
        "NumPy f64 / ours",
        "torch.cov f32 / ours",
    ]
    body = table(header, rows)
    body += (
        f"\n\n{args.rows} float32 rows per update. Machine sgemm rate (best of NumPy/torch, 3072^3) {rate:.0f} "
        "GFLOP/s. "
        "Target: >= 0.70 of the sgemm rate. torch.cov is float32 end to end (no float64 merge)."
    )
    report(
        "StreamingCovariance.update throughput",
        body,
        question="covariance_throughput",
        figures={"updates": rows_figure(header, rows), "rows_per_update": args.rows, "sgemm_gflops": rate},
        targets=[
            target(f"fraction of the sgemm rate >= 0.70 at D = {row[0]:,}", f"{row[3]:.4g}", row[3] >= 0.70)
            for row in rows
        ],
    )


if __name__ == "__main__":
    main()
