"""HC-DLM and its baselines as a :class:`~dihal_fast.train.trainer.TrainingJob`: the model with its loss,
the task's batches and the noise stream. Everything else (AdamW, warm-up, EMA, log, checkpoints, resume,
time budget, DeepSpeed) is the shared loop of :mod:`dihal_fast.train`."""

from __future__ import annotations

import logging
import os
import random
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from dihal_fast.common import resolve_device, seed_everything
from dihal_fast.common.reports import StageReport
from dihal_fast.common.rundir import run_directory
from dihal_fast.errors import DihalTypeError, DihalValueError
from dihal_fast.hcdlm.config import HCDLMTrainConfig, ObjectiveConfig, RunConfig
from dihal_fast.hcdlm.layers import count_parameters
from dihal_fast.hcdlm.models import PARAMETER_TOLERANCE, build_model, kind_of, parameter_match, sampling_parameters
from dihal_fast.hcdlm.noise import make_kernel
from dihal_fast.tasks.registry import build_task
from dihal_fast.train.settings import LoopSettings
from dihal_fast.train.trainer import TrainingJob, fit, prepare_deepspeed, resume_point, training_session

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
# The checkpoint layout before the shared training loop: refused with a message (see check_layout).
LEGACY_POINTER = "latest.json"


class RunObjective(nn.Module):
    """A model with its kind's loss (:mod:`dihal_fast.hcdlm.models`): ``forward(context, target, generator, step)``
    -> the loss parts, ``"loss"`` a tensor; ``step`` sets the exposure share of a ramped schedule
    (``ObjectiveConfig.exposure_at``)."""

    def __init__(self, model: nn.Module, kernel, objective: ObjectiveConfig):
        super().__init__()
        self.model, self.kernel, self.objective = model, kernel, objective

    def forward(self, context: torch.Tensor, target: torch.Tensor, generator: torch.Generator, step: int = 0) -> dict:
        objective = self.objective
        if objective.exposure_ramp_steps:
            objective = replace(objective, exposure_share=objective.exposure_at(step))
        loss, parts = kind_of(self.model).loss(self.model, self.kernel, context, target, objective, generator)
        return {**parts, "loss": loss}


def loop_settings(train: HCDLMTrainConfig, device: str) -> LoopSettings:
    """The shared loop's view of an HC-DLM run: warm-up, then a constant rate (lr_floor 1)."""
    return LoopSettings.from_config(train, lr_floor=1.0, device=device)


def check_layout(run_dir: Path) -> None:
    """Refuse a run written by the checkpoint layout before the shared loop (``latest.json``, ``ckpt-*/state.pt``)."""
    if (run_dir / LEGACY_POINTER).is_file():
        raise DihalValueError(
            f"{run_dir} was written by an earlier dihal_fast (ckpt-*/state.pt and latest.json); this version "
            "reads checkpoints/step_*/ only: train it again into a new --out"
        )


class RunJob(TrainingJob):
    """One HC-DLM / MDM / Latent DM / AR run: task batches from a seeded Python RNG, noise from a torch Generator."""

    resumable = frozenset({"train"})  # steps, budget, device, threads may change between sessions

    def __init__(self, config: RunConfig, run_dir: Path, device: torch.device, rank: int):
        tc = config.train
        seed_everything(tc.seed)
        self.task = build_task(config.task, run_dir, tc.seed)
        model = build_model(self.task.spec, config.model).to(device)
        self.parameters, self.sampling_parameters = count_parameters(model), sampling_parameters(model)
        self.objective = RunObjective(
            model, make_kernel(config.model.kernel, self.task.spec.target_vocab), config.objective
        )
        self.settings = loop_settings(tc, str(device))
        self.configs = {CONFIG_NAME: config.to_dict()}
        self.name = f"train {config.model.kind}"
        self.batch_size = tc.batch_size
        self.task_rng = random.Random(tc.seed + rank)
        self.generator = torch.Generator(device).manual_seed(tc.seed + rank)

    def batch(self, step: int, engine) -> dict:
        context, target = (t.to(engine.device) for t in self.task.train_batch(self.task_rng, self.batch_size))
        return {"context": context, "target": target, "generator": self.generator, "step": step}

    def stream_state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        version, internal, gauss = self.task_rng.getstate()
        return (
            {"task_rng": [version, list(internal), gauss], "generator_device": self.generator.device.type},
            {"generator": self.generator.get_state()},
        )

    def load_stream_state(self, plain: dict, tensors: dict[str, torch.Tensor]) -> None:
        saved = plain.get("generator_device", "cpu")
        if saved != self.generator.device.type:
            raise DihalValueError(
                f"this run was trained on {saved}; resume it with --device {saved} "
                f"(its noise stream cannot move to {self.generator.device.type})"
            )
        try:
            version, internal, gauss = plain["task_rng"]
            self.task_rng.setstate((version, tuple(internal), gauss))
            self.generator.set_state(tensors["generator"])
        except (KeyError, TypeError, ValueError, RuntimeError, OverflowError) as exc:  # wrong types or sizes
            raise DihalValueError(
                f"the checkpoint's data and noise streams (stream.json, stream.safetensors) are damaged "
                f"({type(exc).__name__}: {exc}); resume from another checkpoint or train into a new --out"
            ) from exc


def train(
    config: RunConfig, run_dir: str | os.PathLike, deepspeed_config: str | os.PathLike | None = None
) -> StageReport:
    """Train (or resume) the run in ``run_dir``, holding its lock; returns its summary (the final step, the
    seconds trained on the budget's clock beside the budget, the parameter counts, all and those sampling reads,
    beside the HC-DLM's of the same fields (:func:`~dihal_fast.hcdlm.models.parameter_match`) and the last logged
    losses) as a report on ``run_dir``.

    ``(config, out)`` like every stage's entry point. With ``deepspeed_config`` the DeepSpeed ZeRO engine is used
    (launch several processes with torchrun).
    """
    if not isinstance(config, RunConfig):
        raise DihalTypeError(f"config must be a RunConfig, got {type(config).__name__}")
    with run_directory(run_dir, f"dihal hcdlm train --model {config.model.kind}") as folder:
        check_layout(folder)
        tc = config.train
        if tc.threads:
            torch.set_num_threads(tc.threads)
        settings = loop_settings(tc, str(resolve_device(tc.device)))
        ds_config, world = prepare_deepspeed(deepspeed_config, settings)
        with training_session(ds_config, settings) as (rank, _, session_device):
            job = RunJob(config, folder, torch.device(session_device), rank)
            checkpoint = resume_point(
                folder,
                {CONFIG_NAME: config},
                job.resumable,
                tc.steps,
                ds_config,
                world,
                resume=None,
            )
            if rank == 0:
                config.save(folder / CONFIG_NAME)
            logger.info(
                "%s on %s: %d parameters (%d read by sampling), %d steps, %s",
                config.model.kind,
                config.task.name,
                job.parameters,
                job.sampling_parameters,
                tc.steps,
                session_device,
            )
            run = fit(job, folder, ds_config, checkpoint)
            logger.info(
                "stopped at step %d after %.1f s of %s time (loss %s)",
                run.step,
                run.elapsed_s,
                tc.budget_clock,
                run.values.get("loss"),
            )
            match = parameter_match(job.task.spec, config.model)
            if not match["matched"]:
                logger.warning(
                    "%s has %d parameters, %.2fx the HC-DLM of the same fields (%d): not matched within %d %%",
                    config.model.kind,
                    match["parameters"],
                    match["ratio"],
                    match["hcdlm_parameters"],
                    round(100 * PARAMETER_TOLERANCE),
                )
            summary = {
                "step": run.step,
                "elapsed_s": run.elapsed_s,
                "budget_clock": tc.budget_clock,
                "budget_s": 60 * tc.max_minutes,
                **match,
                **run.values,
            }
            return StageReport(folder, summary)
