"""``train_bridge``: train (or resume) a bridge replacing backbone layers ``1..layer`` and export the hybrid.

Run directory::

    train_config.json, bridge_config.json   the configs (also inside every checkpoint)
    log.jsonl, loss_curve.png                training log and its plot
    checkpoints/step_NNNNNNNN/, latest       checkpoints (see dihal_fast.train.checkpoint)
    validation.json                          validation history and the final report
    hybrid/                                  the exported HybridLM (EMA weights)
    result.json                              the summary train_bridge returns
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dihal_fast.bridge import BridgeConfig
from dihal_fast.common import atomic_write_json, read_json, seed_everything
from dihal_fast.common.models import load_causal_lm, resolve_model_dir
from dihal_fast.common.progress import progress_bar
from dihal_fast.corpus import corpus_files
from dihal_fast.cpu_threads import poll_threads
from dihal_fast.hybrid import HybridLM, backbone_targets
from dihal_fast.hybrid.slicing import check_family, check_layer
from dihal_fast.profiling import nvtx_range
from dihal_fast.train.checkpoint import check_resumable, latest_checkpoint, load_checkpoint, save_checkpoint
from dihal_fast.train.config import TrainConfig
from dihal_fast.train.data import Blocks, batch_indices, load_blocks, step_generator
from dihal_fast.train.ema import EMA
from dihal_fast.train.engines import TorchEngine
from dihal_fast.train.objective import BridgeObjective
from dihal_fast.train.runlog import RunLog
from dihal_fast.train.statistics import target_statistics
from dihal_fast.train.validation import validation_bridge_loss

logger = logging.getLogger(__name__)


@dataclass
class StepInfo:
    """What a ``callback`` sees after each optimizer step."""

    step: int
    losses: dict[str, float]
    engine: object


def _preflight(model_dir, layer: int, corpus, out_dir: Path, config: TrainConfig, deepspeed_config, resume: bool):
    """Every check that needs no model weights: fails fast, before any process group or training."""
    from transformers import AutoConfig

    model_dir = resolve_model_dir(model_dir)
    backbone_config = AutoConfig.from_pretrained(model_dir)
    check_family(backbone_config)
    check_layer(backbone_config, layer)
    corpus_files(corpus)
    ds_config = None
    if deepspeed_config is not None:
        from dihal_fast.train.deepspeed_engine import load_deepspeed_config, world_size_from_env

        ds_config = load_deepspeed_config(deepspeed_config, config)
        world = world_size_from_env()
    else:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1:
            raise ValueError(f"launched with WORLD_SIZE={world} but without --deepspeed; multi-process training uses DeepSpeed")
    checkpoint = latest_checkpoint(out_dir)
    if checkpoint is not None and not resume:
        raise ValueError(f"{out_dir} already holds a training run (checkpoint {checkpoint.name}); pass --resume to continue it or use a new --out")
    start = 0
    if checkpoint is not None:
        start = check_resumable(checkpoint, config, "deepspeed" if ds_config is not None else "torch", world)
        read_json(checkpoint / "bridge_config.json", "checkpoint bridge config")
    elif resume:
        logger.info("--resume: no checkpoint in %s yet, starting at step 0", out_dir)
    return model_dir, ds_config, checkpoint, start


def export_hybrid(backbone, tokenizer, layer: int, bridge_config: BridgeConfig, model_dir: Path, train_upper: bool,
                  weights: dict[str, torch.Tensor]) -> HybridLM:
    """A fresh HybridLM (plain modules, whatever the engine) carrying ``weights`` (EMA of the trainable parameters)."""
    options = {k: v for k, v in bridge_config.to_dict().items() if k not in ("hidden_size", "condition_size", "layer")}
    hybrid = HybridLM.from_backbone(backbone, layer, options, tokenizer, model_dir, freeze_upper=not train_upper)
    prefix = "hybrid."
    state = {name[len(prefix):]: value for name, value in weights.items()}
    missing = set(state) - {name for name, _ in hybrid.named_parameters()}
    if missing:
        raise ValueError(f"exported weights name unknown parameters: {sorted(missing)[:4]}")
    hybrid.load_state_dict(state, strict=False)
    return hybrid.to(next(backbone.parameters()).device).eval()


def train_bridge(model_dir: str | os.PathLike | None, layer: int, corpus: str | os.PathLike, out_dir: str | os.PathLike,
                 config: TrainConfig | None = None, deepspeed_config: str | os.PathLike | None = None, resume: bool = False,
                 val_corpus: str | os.PathLike | None = None, callback: Callable[[StepInfo], None] | None = None) -> dict:
    """Train a bridge for hidden state ``layer`` of ``model_dir`` (None = shipped backbone) on ``corpus``.

    Returns the summary also written to ``out_dir/result.json``: ``bridge_loss`` (validation, EMA weights),
    the validation report, ``hybrid_dir`` and timings. With ``deepspeed_config`` the DeepSpeed engine is
    used (launch several processes with torchrun); otherwise one process with plain torch.
    """
    config = config or TrainConfig()
    out_dir = Path(out_dir)
    model_dir, ds_config, checkpoint, start = _preflight(model_dir, layer, corpus, out_dir, config, deepspeed_config, resume)
    cuda = torch.cuda.is_available()
    if ds_config is None:
        session = contextlib.nullcontext((0, 1))
    else:
        from dihal_fast.train.deepspeed_engine import distributed_session

        session = distributed_session(cuda)
    with session as (rank, _):
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if ds_config is not None and cuda else config.device
        backbone, tokenizer = load_causal_lm(model_dir, config.dtype, device)
        backbone.requires_grad_(False)
        blocks = load_blocks(tokenizer, corpus, config.seq_len, config.val_blocks, config.max_train_tokens, val_corpus)
        bridge_config = _bridge_config(checkpoint, backbone, blocks, layer, config)
        if rank == 0:
            out_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(out_dir / "train_config.json", config.to_dict())
            atomic_write_json(out_dir / "bridge_config.json", bridge_config.to_dict())
        seed_everything(config.seed)
        export = functools.partial(export_hybrid, backbone, tokenizer, layer, bridge_config, model_dir, config.train_upper)
        objective = BridgeObjective(export({}).train(), config)
        if ds_config is not None:
            from dihal_fast.train.deepspeed_engine import DeepSpeedEngine

            engine = DeepSpeedEngine(objective, config, ds_config)
        else:
            engine = TorchEngine(objective.to(device), config)
        with engine.full_parameters() as named:
            ema = EMA(named, config.ema_decay)
        log = RunLog(out_dir / "log.jsonl")
        if checkpoint is not None:
            start = load_checkpoint(checkpoint, engine, ema)
            if rank == 0:
                log.truncate_after(start)
            logger.info("resumed from %s at step %d", checkpoint, start)
        return _loop(engine, ema, backbone, blocks, config, out_dir, start, log, export, callback)


def _bridge_config(checkpoint: Path | None, backbone, blocks: Blocks, layer: int, config: TrainConfig) -> BridgeConfig:
    """The checkpoint's bridge config when resuming, else the options with fresh target statistics."""
    if checkpoint is not None:
        return BridgeConfig.from_dict(read_json(checkpoint / "bridge_config.json", "checkpoint bridge config"))
    bridge_config = config.bridge_options(backbone.config.hidden_size, layer)
    mean, std, condition_rms = target_statistics(backbone, blocks.train[: config.stats_blocks], layer, config.batch_size)
    bridge_config.target_mean, bridge_config.target_std = [float(v) for v in mean], std
    bridge_config.condition_rms = condition_rms
    return bridge_config


def _loop(engine, ema: EMA, backbone, blocks: Blocks, config: TrainConfig, out_dir: Path, start: int, log: RunLog,
          export: Callable[[dict], HybridLM], callback) -> dict:
    rank, device = engine.rank, engine.device
    history = []
    if rank == 0 and start > 0 and (out_dir / "validation.json").is_file():
        history = [h for h in read_json(out_dir / "validation.json")["history"] if h["step"] <= start]
    began, saved_at = time.perf_counter(), start
    bar = progress_bar(total=config.steps, initial=start, disable=rank != 0, desc=f"bridge layer {engine.module.hybrid.config.layer}", unit="step")
    for step in range(start, config.steps):
        poll_threads()
        rows = batch_indices(step, blocks.train.shape[0], config.batch_size, engine.world_size, rank, config.seed)
        ids = blocks.train[rows].to(device)
        hidden, teacher_logits = backbone_targets(backbone, ids, engine.module.hybrid.config.layer)
        randoms = engine.module.random_inputs(*ids.shape, step_generator(config.seed, step, rank))
        with nvtx_range("bridge_step"):
            losses = engine(input_ids=ids, target_hidden=hidden, teacher_logits=teacher_logits if config.w_kd > 0 else None,
                            **{k: v.to(device) for k, v in randoms.items()})
            engine.backward(losses["loss"])
            grad_norm = engine.step()
        with engine.full_parameters() as named:
            ema.update(named, step)
        values = {k: float(v.detach()) for k, v in losses.items()}
        done = step + 1
        bar.update(1)
        bar.set_postfix(loss=f"{values['loss']:.4f}", rec=f"{values['rec']:.3f}")
        record = {"step": done, **values, "lr": engine.lr, "grad_norm": grad_norm, "seconds": time.perf_counter() - began}
        if config.eval_every and done % config.eval_every == 0 and done < config.steps:
            report = _validate(engine, ema, backbone, blocks, config, export, done)
            if report:
                history.append(report)
                record["val_bridge_loss"] = report["bridge_loss"]
        if rank == 0 and (done % config.log_every == 0 or done == config.steps or "val_bridge_loss" in record):
            log.append(record)
        if done % config.save_every == 0 or done == config.steps:
            save_checkpoint(out_dir, done, engine, ema, config, engine.module.hybrid.bridge.config.to_dict())
            saved_at = done
        if callback is not None:
            callback(StepInfo(done, values, engine))
    bar.close()
    final = _validate(engine, ema, backbone, blocks, config, export, config.steps, export_dir=out_dir / "hybrid")
    if rank != 0:
        return {}
    history = history + [final]
    atomic_write_json(out_dir / "validation.json", {"history": history, "final": final})
    log.plot(out_dir / "loss_curve.png", f"bridge for hidden state {final['layer']}",
             [(h["step"], h["bridge_loss"]) for h in history])
    result = {
        "layer": final["layer"], "steps": config.steps, "bridge_loss": final["bridge_loss"], "validation": final,
        "hybrid_dir": str(out_dir / "hybrid"), "engine": engine.kind, "world_size": engine.world_size,
        "train_seconds_this_run": time.perf_counter() - began, "last_checkpoint_step": saved_at,
    }
    atomic_write_json(out_dir / "result.json", result)
    return result


def _validate(engine, ema: EMA, backbone, blocks: Blocks, config: TrainConfig, export, step: int,
              export_dir: Path | None = None) -> dict:
    """Rank 0 validates (and optionally saves) a fresh hybrid with the EMA weights; the others wait."""
    report: dict = {}
    if engine.rank == 0:
        hybrid = export(ema.state_dict())
        report = {"step": step, "layer": hybrid.config.layer,
                  **validation_bridge_loss(hybrid, backbone, blocks.val, config.batch_size, seed=config.seed)}
        logger.info("step %d: validation bridge loss %.4f, hybrid PPL %.2f vs backbone %.2f", step,
                    report["bridge_loss"], report["hybrid_ppl"], report["backbone_ppl"])
        if export_dir is not None:
            hybrid.save_pretrained(export_dir)
    engine.barrier()
    return report
