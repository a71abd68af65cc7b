"""Training loop shared by HC-DLM and the baselines: AdamW with warmup, EMA, JSONL log, checkpoints,
resume, an optional time budget (wall-clock or process CPU time, for equal-time comparisons) and a progress bar."""
from __future__ import annotations

import copy
import logging
import random
import time
from pathlib import Path

import torch

from dihal_fast.common import resolve_device, seed_everything
from dihal_fast.common.progress import progress_bar
from dihal_fast.common.rundir import run_directory
from dihal_fast.hcdlm.checkpoint import latest_checkpoint, load_state, load_weights, save_checkpoint
from dihal_fast.hcdlm.config import RunConfig
from dihal_fast.hcdlm.noise import make_kernel
from dihal_fast.hcdlm.layers import count_parameters
from dihal_fast.hcdlm.models import ARNet, HCDLM, MDMNet, build_model
from dihal_fast.hcdlm.objective import ar_loss, hcdlm_loss, mdm_loss
from dihal_fast.profiling import nvtx_range
from dihal_fast.train.runlog import RunLog
from dihal_fast.tasks.registry import build_task

logger = logging.getLogger(__name__)


def compute_loss(model, kernel, context, target, config: RunConfig, generator: torch.Generator):
    """The objective matching the model type."""
    if isinstance(model, HCDLM):
        return hcdlm_loss(model, kernel, context, target, config.objective, generator)
    if isinstance(model, MDMNet):
        return mdm_loss(model, context, target, generator)
    if isinstance(model, ARNet):
        return ar_loss(model, context, target, generator)
    raise TypeError(f"no objective for {type(model).__name__}")


def warmup_lr(lr: float, warmup_steps: int, step: int) -> float:
    """Linear warm-up over ``warmup_steps``, then constant."""
    return lr * min(1.0, (step + 1) / max(1, warmup_steps))


@torch.no_grad()
def update_ema(ema: torch.nn.Module, model: torch.nn.Module, decay: float, step: int) -> None:
    """EMA with warm-up: the effective decay is ``min(decay, (1 + step) / (10 + step))``."""
    rate = min(decay, (1 + step) / (10 + step))
    for e, p in zip(ema.parameters(), model.parameters()):
        e.lerp_(p, 1 - rate)


def _check_resume(run_dir: Path, config: RunConfig) -> None:
    saved_path = run_dir / "config.json"
    if saved_path.is_file():
        saved = RunConfig.load(saved_path)
        for part in ("task", "model", "objective"):
            if getattr(saved, part) != getattr(config, part):
                raise ValueError(f"{run_dir} holds a run with a different {part} configuration; "
                                 f"use a new --out directory (saved: {getattr(saved, part)})")


def train(run_dir: str | Path, config: RunConfig) -> dict:
    """Train (or resume) the run in ``run_dir``, holding its lock; returns a summary with the final step and loss."""
    with run_directory(run_dir, f"dihal hcdlm train --model {config.model.kind}") as folder:
        return _train(folder, config)


def _train(run_dir: Path, config: RunConfig) -> dict:
    _check_resume(run_dir, config)
    tc = config.train
    if tc.threads:
        torch.set_num_threads(tc.threads)
    device = resolve_device(tc.device)
    seed_everything(tc.seed)
    task = build_task(config.task, run_dir, tc.seed)
    model = build_model(task.spec, config.model).to(device)
    ema = copy.deepcopy(model).requires_grad_(False)
    kernel = make_kernel(config.model.kernel, task.spec.target_vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    task_rng, generator = random.Random(tc.seed), torch.Generator(device).manual_seed(tc.seed)
    step, elapsed = 0, 0.0
    folder = latest_checkpoint(run_dir)
    if folder is not None:
        state = load_state(folder)
        saved_device = state.get("generator_device", "cpu")
        if saved_device != device.type:
            raise ValueError(f"{folder} was trained on {saved_device}; resume it with --device {saved_device} "
                             f"(its noise stream cannot move to {device.type})")
        load_weights(model, folder / "model.safetensors")
        load_weights(ema, folder / "ema.safetensors")
        optimizer.load_state_dict(state["optimizer"])
        task_rng.setstate(state["task_rng"])
        generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        step, elapsed = state["step"], state["elapsed_s"]
        logger.info("resuming %s from step %d", run_dir, step)
    log = RunLog(run_dir / "train_log.jsonl")
    log.truncate_after(step)  # rows a killed run wrote past its last checkpoint are written again
    config.save(run_dir / "config.json")
    n_params = count_parameters(model)
    logger.info("%s on %s: %d parameters, %d steps, %s", config.model.kind, config.task.name, n_params, tc.steps, device)
    budget_s = tc.max_minutes * 60
    parts: dict[str, float] = {}
    clock = time.process_time if tc.budget_clock == "cpu" else time.perf_counter
    started = clock() - elapsed
    model.train()
    with progress_bar(total=tc.steps, initial=step, desc=f"train {config.model.kind}", dynamic_ncols=True) as bar:
        while step < tc.steps and not (budget_s and clock() - started >= budget_s):
            with nvtx_range("hcdlm_train_step"):
                context, target = (t.to(device) for t in task.train_batch(task_rng, tc.batch_size))
                loss, parts = compute_loss(model, kernel, context, target, config, generator)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"non-finite loss {float(loss)} at step {step}: {parts}")
                for group in optimizer.param_groups:
                    group["lr"] = warmup_lr(tc.lr, tc.warmup_steps, step)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if tc.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
                optimizer.step()
                update_ema(ema, model, tc.ema, step)
            step += 1
            bar.update()
            bar.set_postfix(loss=f"{parts['loss']:.4f}")
            if step % tc.log_every == 0 or step == tc.steps:
                record = {"step": step, f"{tc.budget_clock}_s": round(clock() - started, 2), "lr": optimizer.param_groups[0]["lr"], **parts}
                log.append(record)
            if step % tc.checkpoint_every == 0:
                save_checkpoint(run_dir, step, config, model, ema, optimizer, task_rng, generator, clock() - started)
    elapsed = clock() - started
    if latest_checkpoint(run_dir) is None or load_state(latest_checkpoint(run_dir))["step"] != step:
        save_checkpoint(run_dir, step, config, model, ema, optimizer, task_rng, generator, elapsed)
    logger.info("stopped at step %d after %.1f s of %s time (loss %s)", step, elapsed, tc.budget_clock, parts.get("loss"))
    return {"step": step, "elapsed_s": elapsed, "parameters": n_params, **parts}
