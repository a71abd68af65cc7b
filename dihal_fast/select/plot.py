"""The paper's Figure 2: the three proxies and the selection score against depth."""

from __future__ import annotations

import io
from pathlib import Path

from dihal_fast.common import atomic_write_bytes
from dihal_fast.select.estimate import GeometryEstimate

_PANELS = (  # (name, title, log scale allowed)
    ("m_curv", "local curvature $m_{curv}$ (higher = better)", True),
    ("m_mono", "monotonicity $m_{mono}$ (higher = better)", True),
    ("k_eff", "effective rank $k_{eff}$ (lower = better)", True),
    ("score", "selection score (mean over repeats)", False),
)


def plot_geometry(estimate: GeometryEstimate, path: str | Path, title: str = "") -> Path:
    """Write a 2 x 2 PNG: each proxy (log scale when it spans more than 20x) and the score against the hidden-state
    index, with
    error bars of one standard deviation across repeats and the selected layer marked."""
    from matplotlib.figure import Figure  # a bare Figure renders with Agg and leaves pyplot's state alone
    from matplotlib.ticker import MaxNLocator

    best = estimate.selected_layer
    fig = Figure(figsize=(10, 7))
    axes = fig.subplots(2, 2, sharex=True)
    for ax, (name, label, log_scale) in zip(axes.flat, _PANELS):
        mean, std = estimate.mean_std(name)
        ax.errorbar(estimate.layers, mean, yerr=std, marker="o", ms=4, capsize=3, lw=1.2)
        ax.axvline(best, color="tab:red", ls="--", lw=1, label=f"selected layer {best}")
        ax.plot([best], [mean[estimate.layers.index(best)]], "o", color="tab:red", ms=8)
        if log_scale and mean.min() > 0 and mean.max() / mean.min() > 20:
            ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("hidden-state index (layer)")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title or f"layer geometry ({estimate.repeats} repeats)", fontsize=11)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    return atomic_write_bytes(path, buffer.getvalue())
