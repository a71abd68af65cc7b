"""The sweep stage: a fixed-budget bridge per candidate layer, its validation bridge loss, and how well the
geometry score predicted it.

``sweep(SweepConfig(...), out)`` runs locate with repeated score runs, trains a bridge per layer with one
budget, and writes ``out/sweep.json`` and ``out/sweep.png``; reruns reuse finished layers. The layers' bridges
train together (:func:`sweep_bridges`): one teacher forward pass per batch serves all of them, with the numbers
each would get from ``dihal replace`` alone; on the CPU in as many one-thread worker processes as the threads
this process would use (``SweepConfig.workers``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dihal_fast.common import atomic_write_json
from dihal_fast.common.assets import backbone_option, corpus_option, corpus_or_default
from dihal_fast.common.devices import DEVICE_HELP, device_option, dtype_option
from dihal_fast.common.options import option
from dihal_fast.common.validation import CheckedConfig
from dihal_fast.evaluate.correlation import plot_sweep, score_loss_correlations
from dihal_fast.pipeline.locate_stage import LocateConfig
from dihal_fast.pipeline.reports import SweepReport
from dihal_fast.pipeline.reuse import OVERWRITE_HELP, RESUME_HELP, RESUME_HINT, ensure_locate, finished_replace

if TYPE_CHECKING:
    from dihal_fast.replace.config import BridgeTrainConfig

logger = logging.getLogger(__name__)


@dataclass
class SweepBudgetConfig(CheckedConfig):
    """Budget and sizes of a sweep (saved in ``sweep.json``)."""

    # fields added since sweeps were saved, with the values those used
    legacy = {"lr": 3e-3, "warmup_steps": 20, "w_lm": 0.1, "w_kd": 1.0}

    budget_steps: int = option(200, "bridge training steps per layer", min=1)
    score_repeats: int = option(30, "repeated score runs (subsamples)", min=1)
    score_sample: int = option(500, "tokens per score run", min=1)
    max_tokens: int | None = option(40960, "tokens locate reads from the corpus", min=1)
    seq_len: int = option(128, "tokens per block (locate and training)", min=2)
    batch_size: int = option(8, "blocks per bridge training step", min=1)
    val_blocks: int = option(16, "held-out blocks (corpus tail) for the bridge loss", min=1)
    lr: float = option(3e-3, "peak bridge learning rate, as dihal replace's --lr (width-scaled above 128)", gt=0.0)
    warmup_steps: int = option(20, "linear warm-up steps of every bridge", min=0)
    w_lm: float = option(
        0.1, "weight of the next-token loss through the retained layers, as dihal replace's --w-lm", min=0.0
    )
    w_kd: float = option(
        1.0,
        "weight of the distillation loss, as dihal replace's --w-kd; --w-lm 0 --w-kd 0 trains every bridge on its "
        "diffusion and reconstruction losses alone (the rebuilt h_l that the score is about; no retained layer "
        "runs, so each step is cheaper)",
        min=0.0,
    )
    seed: int = option(0, "random seed")

    def train_config(self):
        """The bridge training configuration every layer gets (the same budget for all)."""
        from dihal_fast.replace.config import BridgeTrainConfig

        return BridgeTrainConfig(
            copied_layers=0,  # the paper's question: how well h_l is learned from c(x) alone
            steps=self.budget_steps,
            seq_len=self.seq_len,
            batch_size=self.batch_size,
            val_blocks=self.val_blocks,
            lr=self.lr,
            warmup_steps=self.warmup_steps,
            w_lm=self.w_lm,
            w_kd=self.w_kd,
            seed=self.seed,
        )


@dataclass
class SweepConfig(CheckedConfig):
    """The model, the corpus, the candidate layers and the :class:`SweepBudgetConfig`."""

    model: str | None = backbone_option()
    corpus: list[str] | None = corpus_option()
    layers: list[int] | None = option(None, "candidate layers (default 1..L-1)")
    device: str = device_option(help="device of locate and of every bridge training: " + DEVICE_HELP)
    dtype: str = dtype_option()
    workers: int = option(
        0,
        "processes that train the layers' bridges on the CPU, one thread each (0: as many as the threads this "
        "process would use, e.g. the cores other processes leave free, at most one per layer; 1: one process "
        "with this process's threads). Each layer's run is the one it gets alone with the same thread count; "
        "one thread and two give losses that differ in the last bits (about 1e-10)",
        min=0,
    )
    resume: bool = option(False, RESUME_HELP)
    overwrite: bool = option(False, OVERWRITE_HELP)
    settings: SweepBudgetConfig = field(default_factory=SweepBudgetConfig, metadata={"help": "budget and sizes"})

    def locate_config(self) -> LocateConfig:
        """The locate run that gives the repeated scores."""
        s = self.settings
        return LocateConfig(
            model=self.model,
            corpus=corpus_or_default(self.corpus),
            max_tokens=s.max_tokens,
            repeats=s.score_repeats,
            sample_size=s.score_sample,
            seq_len=s.seq_len,
            layers=self.layers or None,
            seed=s.seed,
            device=self.device,
            dtype=self.dtype,
        )

    def train_config(self):
        """The bridge training configuration every layer gets (the settings' budget, this device and dtype)."""
        return dataclasses.replace(self.settings.train_config(), device=self.device, dtype=self.dtype)


def sweep(config: SweepConfig, out: str | Path) -> SweepReport:
    """Locate (repeated scores), train a bridge per layer with one budget, correlate score and bridge loss;
    in run directory ``out``, holding its lock."""
    from dihal_fast.common.rundir import run_directory

    with run_directory(out, "dihal sweep", resume=config.resume, overwrite=config.overwrite, resume_hint=RESUME_HINT):
        return SweepReport(Path(out), _sweep(config, Path(out)))


def _sweep(config: SweepConfig, out: Path) -> dict:
    from dihal_fast.replace.validation import BRIDGE_LOSS_PROTOCOL

    settings, corpus, model = config.settings, corpus_or_default(config.corpus), config.model
    locate = ensure_locate(out / "locate", config.locate_config())
    candidates = list(locate["candidate_layers"])
    score_runs = np.asarray(locate["per_repeat"]["score"], dtype=np.float64)
    score_rows = {row["layer"]: row["score"] for row in locate["layers"]}
    results = sweep_bridges(out, model, candidates, corpus, config.train_config(), config.workers)
    rows = []
    for layer in candidates:
        loss, hybrid_dir = float(results[layer]["bridge_loss"]), results[layer]["hybrid_dir"]
        logger.info("layer %d: score %.3f, validation bridge loss %.4f", layer, score_rows[layer]["mean"], loss)
        rows.append(
            {
                "layer": layer,
                "score": score_rows[layer]["mean"],
                "score_std": score_rows[layer]["std"],
                "bridge_loss": loss,
                "hybrid_dir": str(hybrid_dir),
            }
        )
    correlations = score_loss_correlations(candidates, score_runs, [r["bridge_loss"] for r in rows])
    learned_nothing = all(r["bridge_loss"] >= 1.0 for r in rows)
    if learned_nothing:
        logger.warning(
            "every bridge's validation loss is >= 1 (no better than predicting the mean of h_l): the correlations "
            "rank failures, not bridgeability; train longer (--budget-steps), at another --lr / --warmup-steps, or on "
            "the bridge losses alone (--w-lm 0 --w-kd 0)"
        )
    bridges = results[candidates[0]]  # every layer trains on the same blocks
    report = {
        "model": locate["model"],
        "corpus": corpus,
        "corpus_tokens": {"locate": locate.get("corpus_tokens"), **bridges.get("corpus_tokens", {})},
        "settings": asdict(settings),
        "layers": rows,
        **{k: correlations[k] for k in ("spearman", "kendall", "pearson", "rank_gap", "layer_gap")},
        "selected_layer": locate["selected_layer"],
        "predicted_layer": correlations["predicted_layer"],
        "observed_best_layer": correlations["observed_best_layer"],
        "selected_in_best_third": correlations["predicted_loss_rank_fraction"] <= 1 / 3,
        "bridges_learned": not learned_nothing,
        "protocol": {
            "correlation": correlations["protocol"],
            "bridge_loss": "validation (corpus tail) bridge loss of dihal_fast.replace: " + BRIDGE_LOSS_PROTOCOL,
            "scores": f"locate with {settings.score_repeats} repeats of {settings.score_sample} tokens",
            "budget": f"{settings.budget_steps} bridge training steps per layer (same for every layer)",
            "objective": "diffusion + reconstruction"
            + (
                f" + {settings.w_lm:g} x next-token + {settings.w_kd:g} x distillation"
                if settings.w_lm or settings.w_kd
                else " only (no retained layer runs)"
            ),
            "documents": bridges.get("documents"),
        },
    }
    plot_sweep(out / "sweep.png", rows, correlations)
    atomic_write_json(out / "sweep.json", report)
    return report


def sweep_bridges(
    out: Path, model: str | None, layers: list[int], corpus: list[str], train: BridgeTrainConfig, workers: int = 1
) -> dict[int, dict]:
    """The bridge training summary of each of ``layers`` in ``out/layer_NN``: read back where that run finished,
    else trained (or resumed) together with the other unfinished layers, each run directory locked
    (:func:`~dihal_fast.replace.lockstep.train_bridges`; ``train`` is the
    :class:`~dihal_fast.replace.config.BridgeTrainConfig` of every layer; ``workers`` as
    :attr:`SweepConfig.workers`)."""
    from dihal_fast.common.checkpoint_config import check_checkpoint_config
    from dihal_fast.common.rundir import run_directory
    from dihal_fast.replace.lockstep import train_bridges

    dirs = {layer: out / f"layer_{layer:02d}" for layer in layers}
    finished = {layer: finished_replace(d, model, layer, corpus, train) for layer, d in dirs.items()}
    results = {layer: result for layer, result in finished.items() if result is not None}
    if results:
        logger.info("reusing the finished bridge trainings of layers %s", sorted(results))
    todo = [layer for layer in layers if layer not in results]
    if todo:
        check_checkpoint_config(model, train.seq_len)  # a bad config.json, a too long --seq-len
        workers = bridge_workers(workers, train.device, len(todo))
        logger.info("training the bridges of layers %s together (%d steps each)", todo, train.steps)
        with contextlib.ExitStack() as locks:
            for layer in todo:
                locks.enter_context(run_directory(dirs[layer], "dihal sweep"))
            results.update(train_bridges(model, todo, corpus, {layer: dirs[layer] for layer in todo}, train, workers))
    return results


def bridge_workers(requested: int, device: str, layers: int) -> int:
    """The worker processes of a sweep's bridge training: 1 off the CPU, ``requested`` if set (at most one per
    layer), else the threads this process would use (a pinned ``DIHAL_NUM_THREADS``, the ``dihal`` command's
    count of the cores other processes leave free, or torch's threads)."""
    from dihal_fast.common.devices import resolve_device
    from dihal_fast.cpu_threads import pinned_threads, poll_threads

    if resolve_device(device).type != "cpu":
        return 1
    if requested < 1:
        import torch

        requested = pinned_threads() or poll_threads() or torch.get_num_threads()
    return max(1, min(requested, layers))
