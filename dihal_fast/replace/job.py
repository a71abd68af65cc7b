"""``train_bridge``: train (or resume) a bridge replacing backbone layers ``1..layer`` and export the hybrid.

The bridge is a :class:`~dihal_fast.train.trainer.TrainingJob` of the shared loop; this module holds
only what is the bridge's: the checks before any weights load, the teacher targets of each batch,
validation with the EMA weights, and the export. Run directory::

    train_config.json, bridge_config.json   the configs (also inside every checkpoint)
    log.jsonl, loss_curve.png                training log and its plot
    checkpoints/step_NNNNNNNN/, latest       checkpoints (see dihal_fast.train.checkpoint)
    validation.json                          validation history and the final report
    hybrid/                                  the exported HybridLM (EMA weights)
    result.json                              the summary train_bridge returns
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dihal_fast.bridge import BridgeConfig
from dihal_fast.common import atomic_write_json, read_json, resolve_device, seed_everything
from dihal_fast.common.devices import dtype_name
from dihal_fast.common.hf_loading import load_causal_lm, resolve_model_dir
from dihal_fast.common.io import kill_point, writing
from dihal_fast.corpus import corpus_files
from dihal_fast.errors import DihalValueError
from dihal_fast.hybrid import HybridLM, backbone_targets, hidden_state
from dihal_fast.hybrid.slicing import check_family, check_layer
from dihal_fast.replace.config import BridgeTrainConfig
from dihal_fast.replace.data import Blocks, batch_indices, load_blocks, step_generator
from dihal_fast.replace.objective import BridgeObjective
from dihal_fast.replace.on_policy import own_continuations
from dihal_fast.replace.placement import check_replace_placement, check_teacher_placed, training_device
from dihal_fast.replace.statistics import Teacher, target_scales, target_statistics
from dihal_fast.replace.validation import validation_bridge_loss
from dihal_fast.train.runlog import RunLog
from dihal_fast.train.trainer import (
    LOG_NAME,
    TrainingJob,
    TrainingRun,
    fit,
    prepare_deepspeed,
    resume_point,
    training_session,
)

logger = logging.getLogger(__name__)


@dataclass
class StepInfo:
    """What a ``callback`` sees after each optimizer step."""

    step: int
    losses: dict[str, float]
    engine: object


# Fields that may change between a run and its resumption (they do not change what a step computes);
# save_every is checkpoint_every's name in checkpoints of earlier versions.
RESUMABLE_CHANGES = frozenset(
    {
        "steps",
        "log_every",
        "eval_every",
        "checkpoint_every",
        "checkpoint_minutes",
        "save_every",
        "keep_checkpoints",
        "device",
        "max_minutes",
        "budget_clock",
    }
)
CONFIG_NAME, BRIDGE_CONFIG_NAME = "train_config.json", "bridge_config.json"


def _preflight(
    model_dir, layer: int, corpus, out_dir: Path, config: BridgeTrainConfig, deepspeed_config, resume: bool, device_map
):
    """Every check that needs no model weights: fails fast, before any process group or training.

    Returns the config with ``device`` and ``dtype`` resolved (``auto`` -> cuda or cpu, the checkpoint's dtype),
    so that the saved config names what ran and a run started with the old defaults resumes."""
    from transformers import AutoConfig

    model_dir = resolve_model_dir(model_dir)
    config = dataclasses.replace(
        config, device=str(resolve_device(config.device)), dtype=dtype_name(config.dtype, model_dir)
    )
    backbone_config = AutoConfig.from_pretrained(model_dir)
    check_family(backbone_config)
    check_layer(backbone_config, layer)
    config.bridge_options(backbone_config.hidden_size, layer)  # copied_layers against this layer, before any work
    check_replace_placement(model_dir, config.device, device_map, deepspeed_config)
    corpus_files(corpus)
    ds_config, world = prepare_deepspeed(deepspeed_config, config.loop_settings())
    checkpoint = resume_point(out_dir, {CONFIG_NAME: config}, RESUMABLE_CHANGES, config.steps, ds_config, world, resume)
    if checkpoint is not None:
        read_json(checkpoint / BRIDGE_CONFIG_NAME, "checkpoint bridge config")
    return model_dir, config, ds_config, checkpoint


def export_hybrid(
    backbone,
    tokenizer,
    layer: int,
    bridge_config: BridgeConfig,
    model_dir: Path,
    train_upper: bool,
    weights: dict[str, torch.Tensor],
    copy_weights: bool = True,
) -> HybridLM:
    """A fresh HybridLM (plain modules, whatever the engine) carrying ``weights`` (EMA of the trainable parameters;
    ``copy_weights``: the copied layers start as the backbone's, else freshly initialised)."""
    options = {k: v for k, v in bridge_config.to_dict().items() if k not in ("hidden_size", "condition_size", "layer")}
    hybrid = HybridLM.from_backbone(
        backbone, layer, options, tokenizer, model_dir, freeze_upper=not train_upper, copy_weights=copy_weights
    )
    prefix = "hybrid."
    state = {name[len(prefix) :]: value for name, value in weights.items()}
    missing = set(state) - {name for name, _ in hybrid.named_parameters()}
    if missing:
        raise DihalValueError(f"exported weights name unknown parameters: {sorted(missing)[:4]}")
    hybrid.load_state_dict(state, strict=False)  # into the parameters from_backbone placed
    return hybrid.eval()


def train_bridge(
    model_dir: str | os.PathLike | None,
    layer: int,
    corpus: str | os.PathLike,
    out_dir: str | os.PathLike,
    config: BridgeTrainConfig | None = None,
    deepspeed_config: str | os.PathLike | None = None,
    resume: bool = False,
    val_corpus: str | os.PathLike | None = None,
    callback: Callable[[StepInfo], None] | None = None,
    device_map: str = "none",
) -> dict:
    """Train a bridge for hidden state ``layer`` of ``model_dir`` (None = shipped backbone) on ``corpus``.

    Returns the summary also written to ``out_dir/result.json``: ``bridge_loss`` (validation, EMA weights),
    the validation report, ``hybrid_dir``, ``model`` (the backbone's directory: ``dihal evaluate`` reads both)
    and timings. With ``deepspeed_config`` the DeepSpeed engine is used (launch several processes with
    torchrun); otherwise one process with plain torch, where ``device_map``
    (``--device-map``: a strategy or a JSON map) spreads the frozen teacher and the retained layers over the
    process's GPUs and the bridge trains on the device of the input embedding (:mod:`dihal_fast.replace.placement`).
    """
    config = config or BridgeTrainConfig()
    out_dir = Path(out_dir)
    model_dir, config, ds_config, checkpoint = _preflight(
        model_dir, layer, corpus, out_dir, config, deepspeed_config, resume, device_map
    )
    with training_session(ds_config, config.loop_settings()) as (rank, _, device):
        backbone, tokenizer = load_causal_lm(model_dir, config.dtype, device, device_map)
        backbone.requires_grad_(False)
        if device_map != "none":
            check_teacher_placed(backbone)
            device = training_device(backbone)
        blocks = load_blocks(tokenizer, corpus, config.seq_len, config.val_blocks, config.max_train_tokens, val_corpus)
        kill_point("data")  # test hook: a kill after data preparation
        job = bridge_job(
            backbone, tokenizer, model_dir, blocks, layer, out_dir, config, checkpoint, device, rank, callback
        )
        began = time.perf_counter()
        run = fit(job, out_dir, ds_config, checkpoint)
        return job.finish(run, time.perf_counter() - began)


def bridge_job(
    backbone,
    tokenizer,
    model_dir: Path,
    blocks: Blocks,
    layer: int,
    out_dir: Path,
    config: BridgeTrainConfig,
    checkpoint: Path | None,
    device: str,
    rank: int,
    callback: Callable[[StepInfo], None] | None = None,
    teacher: Teacher | None = None,
) -> BridgeJob:
    """The bridge job of ``layer`` on a loaded backbone: its configs written to ``out_dir``, a fresh bridge
    initialised from ``config.seed`` (the checkpoint's weights replace it when resuming); ``teacher`` gives the
    backbone's targets (default: :func:`~dihal_fast.hybrid.backbone_targets`, one forward pass per call)."""
    bridge_config = _bridge_config(checkpoint, backbone, blocks, layer, config, teacher)
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out_dir / CONFIG_NAME, config.to_dict())
        atomic_write_json(out_dir / BRIDGE_CONFIG_NAME, bridge_config.to_dict())
    seed_everything(config.seed)
    export = functools.partial(
        export_hybrid,
        backbone,
        tokenizer,
        layer,
        bridge_config,
        model_dir,
        config.train_upper,
        copy_weights=config.copied_init == "backbone",
    )
    return BridgeJob(
        BridgeObjective(export({}).train(), config),
        config,
        bridge_config,
        backbone,
        blocks,
        export,
        device,
        rank,
        callback,
        teacher,
        model_dir,
    )


class BridgeJob(TrainingJob):
    """Bridge training: teacher targets per batch, periodic validation with the EMA weights, the final export."""

    resumable = RESUMABLE_CHANGES

    def __init__(
        self,
        objective: BridgeObjective,
        config: BridgeTrainConfig,
        bridge_config: BridgeConfig,
        backbone,
        blocks: Blocks,
        export: Callable[[dict], HybridLM],
        device: str,
        rank: int,
        callback: Callable[[StepInfo], None] | None,
        teacher: Teacher | None = None,
        model_dir: Path | None = None,
    ):
        self.model_dir = model_dir  # the backbone, named in result.json for dihal evaluate
        self.objective, self.config, self.backbone, self.blocks, self.export = (
            objective,
            config,
            backbone,
            blocks,
            export,
        )
        self.settings = config.loop_settings(device, bridge_config.width)
        self.configs = {CONFIG_NAME: config.to_dict()}
        self.derived = {BRIDGE_CONFIG_NAME: bridge_config.to_dict()}
        self.layer, self.rank, self.callback = bridge_config.layer, rank, callback
        self.teacher: Teacher = teacher or functools.partial(backbone_targets, backbone)
        self.shared_teacher = teacher is not None  # the sweep's: its one pass per batch serves every layer
        self.name = f"bridge layer {self.layer}"
        self.history: list[dict] = []

    def batch(self, step: int, engine) -> dict:
        config = self.config
        rows = batch_indices(
            step, self.blocks.train.shape[0], config.batch_size, engine.world_size, self.rank, config.seed
        )
        ids = self.blocks.train[rows].to(engine.device)
        decoding = config.w_lm > 0 or config.w_kd > 0  # else no step runs the retained layers
        decoding_step, off_period = divmod(step // config.grad_accum_steps, config.lm_every)
        decode = decoding and off_period == 0
        generator = step_generator(config.seed, step, self.rank)
        on_policy = decode and config.on_policy_every > 0 and decoding_step % config.on_policy_every == 0
        if on_policy:
            ids = own_continuations(engine.module.hybrid, ids, config.on_policy_prefix, generator)
        if decode or self.shared_teacher:
            hidden, teacher_logits = self.teacher(ids, self.layer)
        else:
            hidden, teacher_logits = hidden_state(self.backbone, ids, self.layer), None
        randoms = engine.module.random_inputs(*ids.shape, generator)
        return {
            "input_ids": ids,
            "target_hidden": hidden,
            "teacher_logits": teacher_logits if config.w_kd > 0 and decode else None,
            "decode": decode,
            "next_token": not on_policy,
            **{k: v.to(engine.device) for k, v in randoms.items()},
        }

    def after_step(self, step: int, values: dict[str, float], run: TrainingRun) -> dict:
        if not (self.config.eval_every and step % self.config.eval_every == 0 and step < self.config.steps):
            return {}
        report = self._validate(run, step)
        if not report:
            return {}
        self.history.append(report)
        return {"val_bridge_loss": report["bridge_loss"]}

    def stream_state(self) -> tuple[dict, dict]:
        """The validation history so far, saved with each checkpoint: a resumed run's ``validation.json`` then
        holds every validation of the uninterrupted run (it was written only at the end, so a kill lost it)."""
        return {"validation_history": self.history}, {}

    def load_stream_state(self, plain: dict, tensors: dict) -> None:
        history = plain.get("validation_history", [])
        if not isinstance(history, list) or not all(
            isinstance(h, dict) and isinstance(h.get("step"), int) for h in history
        ):
            raise DihalValueError(
                "the checkpoint's validation history (stream.json) is damaged; resume from another "
                "checkpoint or train into a new --out"
            )
        self.history = history

    def step_done(self, step: int, run: TrainingRun) -> None:
        if self.callback is not None:
            self.callback(StepInfo(step, run.values, run.engine))

    def _validate(self, run: TrainingRun, step: int, export_dir: Path | None = None) -> dict:
        """Rank 0 validates (and optionally saves) a fresh hybrid with the EMA weights; the others wait."""
        report: dict = {}
        if self.rank == 0:
            kill_point("validation")  # test hook
            hybrid = self.export(run.ema_weights())
            report = {
                "step": step,
                "layer": hybrid.config.layer,
                **validation_bridge_loss(
                    hybrid,
                    self.backbone,
                    self.blocks.val,
                    self.config.batch_size,
                    seed=self.config.seed,
                    teacher=self.teacher,
                ),
            }
            logger.info(
                "step %d: validation bridge loss %.4f, hybrid PPL %.2f vs backbone %.2f",
                step,
                report["bridge_loss"],
                report["hybrid_ppl"],
                report["backbone_ppl"],
            )
            if export_dir is not None:
                with writing(export_dir):
                    hybrid.save_pretrained(export_dir)
                kill_point("export")  # test hook: a kill between the export and result.json
        run.engine.barrier()
        return report

    def finish(self, run: TrainingRun, seconds: float) -> dict:
        """Final validation and export (EMA weights), ``validation.json``, the loss curve and ``result.json``."""
        out_dir = run.run_dir
        final = self._validate(run, run.step, export_dir=out_dir / "hybrid")
        if self.rank != 0:
            return {}
        history = self.history + [final]
        atomic_write_json(out_dir / "validation.json", {"history": history, "final": final})
        RunLog(out_dir / LOG_NAME).plot(
            out_dir / "loss_curve.png",
            f"bridge for hidden state {final['layer']}",
            [(h["step"], h["bridge_loss"]) for h in history],
        )
        tokens_per_step = self.config.batch_size * self.config.grad_accum_steps * run.engine.world_size
        result = {
            "layer": final["layer"],
            "steps": self.config.steps,
            "steps_trained": run.step,
            "tokens_seen": run.step * tokens_per_step * self.config.seq_len,
            "train_seconds": round(run.elapsed_s, 3),
            "budget_clock": self.config.budget_clock,
            "bridge_loss": final["bridge_loss"],
            "validation": final,
            "hybrid_dir": str((out_dir / "hybrid").absolute()),  # a relative --out is relative to the cwd, not the run
            "model": None if self.model_dir is None else str(Path(self.model_dir).resolve()),
            **self.blocks.provenance,  # corpus_tokens per file, the documents' special tokens
            "engine": run.engine.kind,
            "world_size": run.engine.world_size,
            "train_seconds_this_run": seconds,
            "last_checkpoint_step": run.step,
        }
        atomic_write_json(out_dir / "result.json", result)
        return result


def _bridge_config(
    checkpoint: Path | None, backbone, blocks: Blocks, layer: int, config: BridgeTrainConfig, teacher: Teacher | None
) -> BridgeConfig:
    """The checkpoint's bridge config when resuming, else the options with fresh target statistics."""
    if checkpoint is not None:
        return BridgeConfig.from_dict(read_json(checkpoint / BRIDGE_CONFIG_NAME, "checkpoint bridge config"))
    bridge_config = config.bridge_options(backbone.config.hidden_size, layer)
    mean, variance, condition_rms = target_statistics(
        backbone, blocks.train[: config.stats_blocks], layer, config.batch_size, teacher
    )
    std, dim_std = target_scales(variance, config.scaling_for(bridge_config.copied_layers))
    bridge_config.target_mean, bridge_config.target_std = [float(v) for v in mean], std
    bridge_config.target_dim_std = [] if dim_std is None else [float(v) for v in dim_std]
    bridge_config.condition_rms = condition_rms
    kill_point("statistics")  # test hook: a kill after the target statistics
    return bridge_config
