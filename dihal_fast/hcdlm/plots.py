"""PNG plots of an HC-DLM evaluation: accuracy against sampling steps, the read-out after each step, the
decoded answer per normalised step of several models, and the input ablations."""

from __future__ import annotations

import io
from pathlib import Path

from dihal_fast.common import atomic_write_bytes


def save_lines(
    series: dict[str, tuple[list[float], list[float]]],
    path: str | Path,
    xlabel: str,
    ylabel: str,
    title: str,
    log_x: bool = False,
    markers: bool = False,
) -> Path:
    """One line per ``label -> (x, y)``; with ``log_x`` a log axis ticked at every x. Returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for label, (x, y) in series.items():
        ax.plot(x, y, marker="o" if log_x or markers else None, label=label)
    if log_x:
        ax.set_xscale("log")
        ticks = sorted({v for x, _ in series.values() for v in x})
        ax.set_xticks(ticks, [str(v) for v in ticks])
        ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    return atomic_write_bytes(path, buffer.getvalue())


def plot_accuracy_vs_steps(
    curves: dict[str, list[dict]],
    path: str | Path,
    title: str = "accuracy vs sampling steps",
    ylabel: str = "accuracy (%)",
) -> Path:
    """One line per model (``label -> rows`` of ``accuracy_vs_steps``), log-x."""
    series = {
        label: ([r["steps"] for r in rows], [100 * r["accuracy"] for r in rows]) for label, rows in curves.items()
    }
    return save_lines(series, path, "sampling steps", ylabel, title, log_x=True)


def plot_readout_by_step(rows: list[dict], path: str | Path, title: str) -> Path:
    """Every score of ``readout_by_step`` (in %) against the sampling step."""
    keys = [k for k in rows[0] if k not in ("step", "n")]
    series = {k.replace("_", " "): ([r["step"] for r in rows], [100 * r[k] for r in rows]) for k in keys}
    return save_lines(series, path, "sampling step (1 = first, from noise)", "read-out score (%)", title)


def plot_trajectories(trajectories: dict[str, list[dict]], key: str, path: str | Path, title: str) -> Path:
    """``key`` (in %) of the decoded answer against the normalised sampling step, one line per model (Fig. 3a)."""
    series = {
        label: ([r["fraction"] for r in rows], [100 * r[key] for r in rows]) for label, rows in trajectories.items()
    }
    return save_lines(series, path, "sampling step / steps", f"decoded {key.replace('_', ' ')} (%)", title)


def plot_ablations(rows: list[dict], key: str, path: str | Path, title: str) -> Path:
    """``key`` (in %) of the one-step read-out against the noise level, one line per input ablation."""
    names = [name for name in rows[0] if name != "s"]
    series = {name.replace("_", " "): ([r["s"] for r in rows], [100 * r[name][key] for r in rows]) for name in names}
    return save_lines(series, path, "noise level s", f"read-out {key.replace('_', ' ')} (%)", title, markers=True)
