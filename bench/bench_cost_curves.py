"""How does the cost of knn, geometry_proxies and StreamingCovariance.update grow with n and D?

Times ours and the peers in the same run on low-rank-plus-noise float32 rows: against n at a fixed
D, and against D at a fixed n. Peers: FAISS IndexFlatL2 and scikit-learn brute force for the kNN,
the scikit-learn + NumPy pipeline of bench_proxies.py for the proxies, NumPy float64 X^T X and
torch.cov for the covariance. The slow peers run on the smaller sizes only. Writes a log-log plot
with the fitted exponent of each curve (slope of log time against log size) and appends the table
as the record of bench/README.md's cost-curve section.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from _common import best_time, report, rows_figure, table
from bench_proxies import data, researcher_pipeline

import dihal_fast as df


def _knn_methods(k: int) -> dict:
    import faiss
    from sklearn.neighbors import NearestNeighbors

    def run_faiss(X):
        index = faiss.IndexFlatL2(X.shape[1])
        index.add(X)
        return index.search(X, k + 1)

    return {
        "ours": lambda X: df.knn(X, k),
        "faiss IndexFlatL2": run_faiss,
        "sklearn brute": lambda X: NearestNeighbors(n_neighbors=k + 1, algorithm="brute").fit(X).kneighbors(X),
    }


def _proxy_methods() -> dict:
    return {
        "ours float64": lambda X: df.geometry_proxies(X),
        "ours float32": lambda X: df.geometry_proxies(X, precision="float32"),
        "sklearn+NumPy": researcher_pipeline,
    }


def _covariance_methods() -> dict:
    import torch

    def numpy_f64(X):
        Xc = X.astype(np.float64) - X.mean(0, dtype=np.float64)
        return Xc.T @ Xc

    return {
        "ours": lambda X: df.StreamingCovariance(X.shape[1]).update(X),
        "NumPy float64": numpy_f64,
        "torch.cov float32": lambda X: torch.cov(torch.from_numpy(X).T, correction=0),
    }


def exponent(sizes: list[int], times: list[float]) -> float:
    """Least-squares slope of log(time) against log(size) over the three largest sizes (the smallest
    ones are dominated by fixed costs)."""
    if len(sizes) < 2:
        return float("nan")
    return float(np.polyfit(np.log(sizes[-3:]), np.log(times[-3:]), 1)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ns", type=int, nargs="+", default=[1000, 3000, 10000, 30000], help="rows, at --dim")
    parser.add_argument("--dim", type=int, default=256, help="D of the n curve")
    parser.add_argument("--dims", type=int, nargs="+", default=[256, 1024, 4096], help="D, at --n")
    parser.add_argument("--n", type=int, default=3000, help="n of the D curve")
    parser.add_argument("--peer-max-n", type=int, default=10000, help="largest n for the sklearn peers")
    parser.add_argument("--peer-max-dim", type=int, default=1024, help="largest D for the sklearn+NumPy proxies")
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--plot", default=str(Path(__file__).with_name("cost_curves.png")))
    args = parser.parse_args()

    ops = {
        "knn": _knn_methods(args.k),
        "geometry_proxies": _proxy_methods(),
        "covariance update": _covariance_methods(),
    }
    slow = {"sklearn brute", "sklearn+NumPy"}
    grids = {"n": [(n, args.dim) for n in args.ns], "D": [(args.n, D) for D in args.dims]}
    curves: dict[tuple[str, str, str], tuple[list[int], list[float]]] = {}
    for axis, grid in grids.items():
        for n, D in grid:
            X = data(n, D)
            for op, methods in ops.items():
                for name, fn in methods.items():
                    if name in slow and (n > args.peer_max_n or (op == "geometry_proxies" and D > args.peer_max_dim)):
                        continue
                    seconds = best_time(lambda: fn(X), 1, warmup=1 if n * D <= 3_000_000 else 0)
                    sizes, times = curves.setdefault((axis, op, name), ([], []))
                    sizes.append(n if axis == "n" else D)
                    times.append(seconds)
                    print(f"{axis}: n={n} D={D} {op:18s} {name:20s} {seconds:8.3f} s", flush=True)

    rows = []
    for (axis, op, name), (sizes, times) in curves.items():
        fixed = f"D={args.dim}" if axis == "n" else f"n={args.n}"
        cells = ", ".join(f"{s}: {t:.3g}" for s, t in zip(sizes, times))
        rows.append([op, name, f"{axis} ({fixed})", cells, f"{exponent(sizes, times):.2f}"])
    _plot(curves, args)
    header = ["operation", "method", "against", "size: seconds", "fitted exponent (3 largest)"]
    body = table(header, rows)
    body += (
        f"\n\nfloat32 low-rank-plus-noise rows (bench_proxies.data), k={args.k}, one timed call each (a warm-up "
        f"call for the small sizes). sklearn peers only up to n={args.peer_max_n} (proxies up to "
        f"D={args.peer_max_dim}). "
        "Expected exponents: kNN and proxies n^2 D (the kNN product), covariance n D^2."
        f"\n\n![cost against n and D, log-log]({Path(args.plot).name})"
    )
    report(
        "Cost curves: knn, geometry_proxies, StreamingCovariance.update against n and D",
        body,
        question="cost_curves",
        figures={
            "curves": rows_figure(header, rows),
            "k": args.k,
            "seconds": {
                f"{op} | {name} | {axis}": dict(zip(map(str, sizes), times))
                for (axis, op, name), (sizes, times) in curves.items()
            },
        },
    )


def _plot(curves: dict, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    colours = {"knn": "tab:blue", "geometry_proxies": "tab:red", "covariance update": "tab:green"}
    styles = ["-", "--", ":", "-."]
    for ax, axis in zip(axes, ("n", "D")):
        seen: dict[str, int] = {}
        for (curve_axis, op, name), (sizes, times) in curves.items():
            if curve_axis != axis:
                continue
            style = styles[seen.setdefault(op, 0) % len(styles)]
            seen[op] += 1
            ax.loglog(
                sizes,
                times,
                style,
                marker="o",
                color=colours[op],
                label=f"{op}: {name} (slope {exponent(sizes, times):.2f})",
            )
        ax.set_xlabel(f"{axis} ({'D=' + str(args.dim) if axis == 'n' else 'n=' + str(args.n)})")
        ax.set_ylabel("seconds")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("dihal_fast cost curves vs peers (same run)")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    main()
