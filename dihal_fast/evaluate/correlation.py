"""Score vs bridgeability across layers: rank correlations over repeated score runs, rank gap, plot."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from scipy import stats

from dihal_fast.common import atomic_write_bytes
from dihal_fast.errors import DihalValueError

PROTOCOL = (
    "for each repeated score run r, Spearman/Kendall(tau-b)/Pearson between score_r(layer) and "
    "-bridge_loss(layer) over the candidate layers; reported as mean and std (ddof=1, as locate's) over runs. "
    "rank_gap = position (0 = best) of the best-scoring layer (argmax of the mean score, ties to the "
    "shallower layer) in the ascending order of bridge loss; layer_gap = |that layer - the lowest-loss layer|"
)


def _stat(values: list[float]) -> dict:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return {"mean": None, "std": None, "n_runs": 0}
    std = float(np.std(finite, ddof=1)) if len(finite) > 1 else None
    return {"mean": float(np.mean(finite)), "std": std, "n_runs": len(finite)}


def score_loss_correlations(layers: Sequence[int], score_runs: np.ndarray, bridge_loss: Sequence[float]) -> dict:
    """Correlations between repeated scores ``score_runs[R, n_layers]`` and ``-bridge_loss[n_layers]``.

    Returns ``{spearman, kendall, pearson}`` (each ``{mean, std, n_runs}``; a run where either side is
    constant has no defined correlation and is left out, with ``n_runs`` saying how many counted),
    ``rank_gap``, ``layer_gap``, ``predicted_layer``, ``observed_best_layer`` and ``protocol``.
    """
    score_runs = np.atleast_2d(np.asarray(score_runs, dtype=np.float64))
    loss = np.asarray(bridge_loss, dtype=np.float64)
    if len(layers) < 3 or score_runs.shape[1] != len(layers) or loss.shape != (len(layers),):
        raise DihalValueError(
            f"need >= 3 layers with one score per layer per run and one loss per layer; got {len(layers)} layers, "
            f"scores {score_runs.shape}, losses {loss.shape}"
        )
    if not np.isfinite(loss).all() or not np.isfinite(score_runs).all():
        raise DihalValueError("scores and bridge losses must be finite")
    out: dict = {}
    for name, fn in (("spearman", stats.spearmanr), ("kendall", stats.kendalltau), ("pearson", stats.pearsonr)):
        values = []
        for run in score_runs:
            if np.ptp(run) == 0 or np.ptp(loss) == 0:
                continue
            values.append(float(fn(run, -loss)[0]))
        out[name] = _stat(values)
    mean_score = score_runs.mean(axis=0)
    predicted = int(np.argmax(mean_score))  # first maximum = shallower layer on ties
    order = list(np.argsort(loss, kind="stable"))
    out.update(
        predicted_layer=int(layers[predicted]),
        observed_best_layer=int(layers[order[0]]),
        rank_gap=order.index(predicted),
        layer_gap=abs(int(layers[predicted]) - int(layers[order[0]])),
        predicted_loss_rank_fraction=(order.index(predicted) + 1) / len(layers),
        protocol=PROTOCOL,
    )
    return out


def plot_sweep(path: str | Path, rows: Sequence[Mapping], correlations: Mapping) -> Path:
    """Scatter of score vs bridge loss and both against depth (``rows``: layer, score, score_std, bridge_loss)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = [r["layer"] for r in rows]
    score = [r["score"] for r in rows]
    std = [r.get("score_std") or 0.0 for r in rows]
    loss = [r["bridge_loss"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.errorbar(score, loss, xerr=std, fmt="o", capsize=3)
    for layer, x, y in zip(layers, score, loss):
        left.annotate(str(layer), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    rho = correlations["spearman"]["mean"]
    left.set(
        xlabel="selection score (mean over runs)",
        ylabel="validation bridge loss",
        title=f"score vs bridge loss (Spearman with -loss, mean over runs: {rho:.3f})"
        if rho is not None
        else "score vs bridge loss",
    )
    right.plot(layers, score, "o-", color="tab:blue", label="score")
    right.set(xlabel="layer", ylabel="selection score")
    right.xaxis.get_major_locator().set_params(integer=True)
    twin = right.twinx()
    twin.plot(layers, loss, "s--", color="tab:red", label="bridge loss")
    twin.set_ylabel("validation bridge loss")
    right.axvline(correlations["predicted_layer"], color="tab:blue", alpha=0.3, lw=6, label="best score")
    right.axvline(correlations["observed_best_layer"], color="tab:red", alpha=0.3, lw=2, label="lowest loss")
    handles = right.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    right.legend(handles=handles, loc="upper left", fontsize=8)
    right.set_title("score and bridge loss against depth")
    fig.tight_layout()
    return save_figure(fig, path)


def save_figure(fig, path: str | Path) -> Path:
    """Write a matplotlib figure as PNG atomically and close it."""
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return atomic_write_bytes(path, buffer.getvalue())
