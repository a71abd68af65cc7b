"""The layer sweep: a fixed-budget bridge per candidate layer, its validation bridge loss, and how well the
geometry score predicted it (``RUN/sweep.json``, ``RUN/sweep.png``)."""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dihal_fast.common import atomic_write_json, read_json
from dihal_fast.common.progress import progress_bar
from dihal_fast.evaluate.correlation import plot_sweep, score_loss_correlations
from dihal_fast.evaluate.stages import ensure_locate, ensure_replace

logger = logging.getLogger(__name__)


@dataclass
class SweepSettings:
    """Budget and sizes of a sweep (saved in ``sweep.json``)."""

    budget_steps: int = 200
    score_repeats: int = 30
    score_sample: int = 500
    max_tokens: int | None = 40960
    seq_len: int = 128
    batch_size: int = 8
    val_blocks: int = 16
    seed: int = 0

    def train_config(self):
        """The bridge training configuration every layer gets (the same budget for all)."""
        from dihal_fast.train.config import TrainConfig

        return TrainConfig(steps=self.budget_steps, seq_len=self.seq_len, batch_size=self.batch_size,
                           val_blocks=self.val_blocks, seed=self.seed)


def run_sweep(model: str | None, corpus: list[str], out: str | Path, settings: SweepSettings,
              layers: list[int] | None = None) -> dict:
    """Locate (repeated scores), train a bridge per layer with one budget, correlate score and bridge loss."""
    from dihal_fast.train.validation import BRIDGE_LOSS_PROTOCOL

    out = Path(out)
    options = ["--repeats", settings.score_repeats, "--sample-size", settings.score_sample,
               "--seq-len", settings.seq_len, "--seed", settings.seed]
    if settings.max_tokens is not None:
        options += ["--max-tokens", settings.max_tokens]
    if layers:
        options += ["--layers", *layers]
    locate = ensure_locate(out / "locate", model, corpus, options)
    candidates = list(locate["candidate_layers"])
    score_runs = np.asarray(locate["per_repeat"]["score"], dtype=np.float64)
    score_rows = {row["layer"]: row["score"] for row in locate["layers"]}
    rows = []
    for layer in progress_bar(candidates, desc="sweep (bridge per layer)"):
        result = ensure_replace(out / f"layer_{layer:02d}", model, layer, corpus, settings.train_config())
        loss, hybrid_dir = float(result["bridge_loss"]), result["hybrid_dir"]
        logger.info("layer %d: score %.3f, validation bridge loss %.4f", layer, score_rows[layer]["mean"], loss)
        rows.append({"layer": layer, "score": score_rows[layer]["mean"], "score_std": score_rows[layer]["std"],
                     "bridge_loss": loss, "hybrid_dir": str(hybrid_dir)})
    correlations = score_loss_correlations(candidates, score_runs, [r["bridge_loss"] for r in rows])
    report = {
        "model": locate["model"], "corpus": corpus, "settings": asdict(settings), "layers": rows,
        **{k: correlations[k] for k in ("spearman", "kendall", "pearson", "rank_gap", "layer_gap")},
        "selected_layer": locate["selected_layer"], "predicted_layer": correlations["predicted_layer"],
        "observed_best_layer": correlations["observed_best_layer"],
        "selected_in_best_third": correlations["predicted_loss_rank_fraction"] <= 1 / 3,
        "protocol": {"correlation": correlations["protocol"], "bridge_loss": "validation (corpus tail) bridge loss of dihal_fast.train: " + BRIDGE_LOSS_PROTOCOL,
                     "scores": f"locate with {settings.score_repeats} repeats of {settings.score_sample} tokens",
                     "budget": f"{settings.budget_steps} bridge training steps per layer (same for every layer)"},
    }
    plot_sweep(out / "sweep.png", rows, correlations)
    atomic_write_json(out / "sweep.json", report)
    return report


def sweep_controls(sweep_dir: str | Path) -> dict[str, str]:
    """The oracle (lowest bridge loss) and worst (highest) layers' hybrid directories of a finished sweep."""
    report = read_json(Path(sweep_dir) / "sweep.json", "sweep report (from `dihal sweep`)")
    rows = report.get("layers") or []
    if not rows or any("hybrid_dir" not in r or "bridge_loss" not in r for r in rows):
        raise ValueError(f"{sweep_dir}/sweep.json lists no layers with hybrid_dir and bridge_loss")
    ordered = sorted(rows, key=lambda r: r["bridge_loss"])
    return {f"oracle_layer_{ordered[0]['layer']}": ordered[0]["hybrid_dir"],
            f"worst_layer_{ordered[-1]['layer']}": ordered[-1]["hybrid_dir"]}
