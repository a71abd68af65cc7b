"""The one training loop of the package: the backbone, the bridge and HC-DLM each describe their run as a
:class:`TrainingJob` (an objective module, a batch per step, their configs) and call :func:`fit`.

``fit`` owns what every family needs the same way: the engine (plain torch or DeepSpeed ZeRO), the LR
schedule, gradient clipping, the EMA, the JSONL log, checkpoints and exact resume, an optional time
budget (wall-clock or process CPU time, for equal-time comparisons), thread governance on shared
machines, the progress bar, NVTX ranges, and a clean stop on SIGTERM or Ctrl-C with a checkpoint of the last
step (:mod:`dihal_fast.train.stop`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from dihal_fast.common import read_json
from dihal_fast.common.devices import resolve_device
from dihal_fast.common.io import kill_point
from dihal_fast.common.launch import launcher_env
from dihal_fast.common.progress import progress_bar
from dihal_fast.common.serial import SerialConfig
from dihal_fast.cpu_threads import poll_threads
from dihal_fast.errors import DihalValueError
from dihal_fast.profiling import nvtx_range
from dihal_fast.train.checkpoint import check_resumable, latest_checkpoint, load_checkpoint, save_checkpoint
from dihal_fast.train.ema import EMA
from dihal_fast.train.engines import Engine, TorchEngine
from dihal_fast.train.runlog import RunLog
from dihal_fast.train.settings import LoopSettings
from dihal_fast.train.stop import StopRequest, interrupted, stop_on_signals

logger = logging.getLogger(__name__)

LOG_NAME = "log.jsonl"


class TrainingJob:
    """What a family tells :func:`fit`. Subclasses set the attributes and override :meth:`batch`.

    ``objective(**batch)`` returns a dict of losses whose ``"loss"`` is minimised (tensors or floats);
    ``configs`` are saved in every checkpoint by file name and compared on resume, except the fields in
    ``resumable``; ``derived`` configs (computed from data, e.g. target statistics) are saved, not compared.
    """

    name: str = "train"
    objective: nn.Module
    settings: LoopSettings
    configs: dict[str, dict]
    derived: dict[str, dict] = {}
    resumable: frozenset[str] = frozenset()

    def batch(self, step: int, engine: Engine) -> dict:
        """Keyword inputs of the objective for micro-batch ``step`` (0-based) on ``engine.device``.

        Without gradient accumulation this is the optimizer step; with ``grad_accum_steps = A`` optimizer step
        ``s`` is made of micro-batches ``s * A .. s * A + A - 1``, called in that order: a job whose batch
        ``i`` holds rows ``i * B .. i * B + B - 1`` of one stream then trains on the same rows as ``A x B``
        without accumulation."""
        raise NotImplementedError

    def stream_state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """The family's own random streams (JSON part, tensor part), saved with each checkpoint."""
        return {}, {}

    def load_stream_state(self, plain: dict, tensors: dict[str, torch.Tensor]) -> None:
        """Restore what :meth:`stream_state` returned."""

    def after_step(self, step: int, values: dict[str, float], run: TrainingRun) -> dict:
        """Extra log fields after optimizer step ``step`` (1-based); a non-empty dict logs the step."""
        return {}

    def on_checkpoint(self, step: int, run: TrainingRun) -> None:
        """Called on every rank after checkpoint ``step`` is written (e.g. to export a model)."""

    def step_done(self, step: int, run: TrainingRun) -> None:
        """Called at the very end of optimizer step ``step`` (1-based), after its log line and checkpoint."""


@dataclass
class TrainingRun:
    """The state of a run inside :func:`fit`, handed to the job's hooks and returned at the end."""

    engine: Engine
    ema: EMA | None
    run_dir: Path
    step: int = 0
    checkpoint_step: int = 0  # the step of the newest checkpoint in run_dir (0: none)
    checkpoint_time: float = field(default_factory=time.monotonic)  # when it was written (or the run started)
    elapsed_s: float = 0.0
    resumed_s: float = 0.0  # elapsed_s of the checkpoint the run resumed from
    values: dict[str, float] = field(default_factory=dict)
    log: RunLog | None = None

    def ema_weights(self) -> dict[str, torch.Tensor]:
        """The EMA of the trainable parameters (or, without an EMA, their current values), on the CPU."""
        if self.ema is not None:
            return self.ema.state_dict()
        with self.engine.full_parameters() as named:
            return {n: p.detach().float().cpu().clone() for n, p in named}


def make_engine(objective: nn.Module, settings: LoopSettings, ds_config: dict | None) -> Engine:
    """A DeepSpeed engine when ``ds_config`` is given (inside :func:`training_session`), else plain torch; an
    objective holding a model spread over several devices (``hf_device_map``, as transformers' Trainer checks) is
    left where it was placed."""
    if ds_config is None:
        spread = any(len(set(getattr(m, "hf_device_map", {}).values())) > 1 for m in objective.modules())
        return TorchEngine(objective if spread else objective.to(settings.device), settings)
    from dihal_fast.train.deepspeed_engine import DeepSpeedEngine

    return DeepSpeedEngine(objective, settings, ds_config)


def prepare_deepspeed(deepspeed_config: str | os.PathLike | None, settings: LoopSettings) -> tuple[dict | None, int]:
    """The checked DeepSpeed config (or None) and the world size; refuses several processes without DeepSpeed."""
    if deepspeed_config is not None:
        from dihal_fast.train.deepspeed_engine import load_deepspeed_config, world_size_from_env

        return load_deepspeed_config(deepspeed_config, settings), world_size_from_env()
    world = launcher_env().world_size
    if world > 1:
        raise DihalValueError(
            f"launched with WORLD_SIZE={world} but without --deepspeed; multi-process training uses DeepSpeed"
        )
    return None, 1


@contextlib.contextmanager
def training_session(ds_config: dict | None, settings: LoopSettings) -> Iterator[tuple[int, int, str]]:
    """``(rank, world_size, device)``: a DeepSpeed process group when ``ds_config`` is given, else one process
    (on ``settings.device`` resolved: ``auto`` is cuda when torch sees one)."""
    if ds_config is None:
        yield 0, 1, str(resolve_device(settings.device))
        return
    from dihal_fast.train.deepspeed_engine import distributed_session

    cuda = torch.cuda.is_available()
    with distributed_session(cuda) as (rank, world):
        yield rank, world, f"cuda:{launcher_env().local_rank}" if cuda else str(resolve_device(settings.device))


def resume_point(
    run_dir: Path,
    configs: Mapping[str, SerialConfig | dict],
    resumable: Iterable[str],
    steps: int,
    ds_config: dict | None,
    world_size: int,
    resume: bool | None,
) -> Path | None:
    """The checkpoint to continue from, checked against this run's ``configs`` (by file name in the checkpoint)
    and engine (DeepSpeed when ``ds_config`` is given, as in :func:`make_engine`; see
    :func:`~dihal_fast.train.checkpoint.check_resumable`); ``resume=None`` continues whenever one exists. Of a
    config given as a :class:`~dihal_fast.common.serial.SerialConfig`, a field added since the checkpoint was saved
    is compared only when it differs from its ``legacy`` value (``comparable_to``); a plain dict is compared whole.
    Needs no job, so a family can call it before it loads any weights."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is not None and resume is False:
        raise DihalValueError(
            f"{run_dir} already holds a training run (checkpoint {checkpoint.name}); pass --resume to continue it or "
            "use a new --out"
        )
    if checkpoint is None:
        if resume:
            logger.info("--resume: no checkpoint in %s yet, starting at step 0", run_dir)
        return None
    compared = {
        name: config.comparable_to(_saved(checkpoint / name)) if isinstance(config, SerialConfig) else config
        for name, config in configs.items()
    }
    check_resumable(
        checkpoint, compared, resumable, "deepspeed" if ds_config is not None else "torch", world_size, steps
    )
    return checkpoint


def _saved(path: Path) -> object:
    """A checkpoint's saved config, or None when the file is missing (check_resumable names it)."""
    return read_json(path, "checkpoint config") if path.is_file() else None


def fit(
    job: TrainingJob,
    run_dir: str | os.PathLike,
    ds_config: dict | None = None,
    checkpoint: Path | None = None,
    stop_at: int | None = None,
    progress: bool = True,
) -> TrainingRun:
    """Train ``job`` in ``run_dir`` from ``checkpoint`` (see :func:`resume_point`) up to its ``steps``,
    its time budget, or ``stop_at`` optimizer steps (as if interrupted, with a checkpoint)."""
    with stop_on_signals() as stop:
        run = _start(job, Path(run_dir), ds_config, checkpoint)
        end = job.settings.steps if stop_at is None else min(job.settings.steps, stop_at)
        try:
            for _ in _steps(job, run, end, progress, stop):
                pass
        except KeyboardInterrupt:  # a second Ctrl-C: the newest checkpoint stays the latest
            raise interrupted([run]) from None
        if stop.requested:
            raise interrupted([run])
    return run


def fit_lockstep(
    jobs: Sequence[tuple[TrainingJob, str | os.PathLike, Path | None]],
    desc: str = "train (lockstep)",
    position: int | None = None,
) -> list[TrainingRun]:
    """Train several plain-torch jobs ``(job, run_dir, checkpoint)`` in turn, one optimizer step at a time (step
    ``s`` of every job before step ``s + 1`` of any; a job resumed further waits for the others): jobs whose batches
    share work, as the bridges of one sweep share the teacher's forward pass of each batch, do it once per step.

    Each job's run is exactly what :func:`fit` gives it alone (same checkpoints, log and numbers): its time budget
    and ``elapsed_s`` count only its own steps. ``position``: the progress bar's line (one per worker process)."""
    with stop_on_signals() as stop:
        runs = [_start(job, Path(run_dir), None, checkpoint) for job, run_dir, checkpoint in jobs]
        pending = [(run, _steps(job, run, job.settings.steps, False, stop)) for (job, _, _), run in zip(jobs, runs)]
        bar = progress_bar(
            total=sum(job.settings.steps for job, _, _ in jobs),
            initial=sum(run.step for run in runs),
            desc=desc,
            unit="step",
            dynamic_ncols=True,
            position=position,
        )
        try:
            while pending:  # after a stop request each run checkpoints its last step and ends
                lowest = min(run.step for run, _ in pending)
                for item in [item for item in pending if item[0].step == lowest]:
                    if next(item[1], None) is None:
                        pending.remove(item)
                    else:
                        bar.update(1)
        except KeyboardInterrupt:
            raise interrupted(runs) from None
        bar.close()
        if stop.requested:
            raise interrupted(runs)
    return runs


def _start(job: TrainingJob, run_dir: Path, ds_config: dict | None, checkpoint: Path | None) -> TrainingRun:
    """The engine, the EMA and the log of ``job``'s run in ``run_dir``, restored from ``checkpoint`` if given."""
    settings = job.settings
    engine = make_engine(job.objective.train(), settings, ds_config)
    ema = None
    if settings.ema_decay > 0:
        with engine.full_parameters() as named:
            ema = EMA(named, settings.ema_decay)
    run = TrainingRun(engine, ema, run_dir)
    if checkpoint is not None:
        run.step, state, stream = load_checkpoint(checkpoint, engine, ema)
        run.checkpoint_step = run.step
        run.elapsed_s = run.resumed_s = float(state.get("elapsed_s", 0.0))
        job.load_stream_state(*stream)
        logger.info("resumed %s from step %d", run_dir, run.step)
    if engine.rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        run.log = RunLog(run_dir / LOG_NAME)
        run.log.truncate_after(run.step)  # rows a killed run wrote past its last checkpoint are written again
    return run


def _steps(job: TrainingJob, run: TrainingRun, end: int, progress: bool, stop: StopRequest) -> Iterator[int]:
    """The training loop, yielding the step count after each optimizer step; time spent by the caller between
    steps (other jobs' steps in :func:`fit_lockstep`) is not counted in ``run.elapsed_s`` or the time budget.

    Before each step the processes agree whether to stop (a signal on any of them, the time budget) and whether a
    checkpoint is due by wall time (``checkpoint_minutes`` since the last one); a stopped run checkpoints its last
    step. Checkpoints hold the exact state between steps, so when they are written never changes the numbers."""
    settings, engine = job.settings, run.engine
    clock: Callable[[], float] = time.process_time if settings.budget_clock == "cpu" else time.perf_counter
    budget_s, every_s = settings.max_minutes * 60, settings.checkpoint_minutes * 60
    started = clock() - run.elapsed_s
    bar = progress_bar(
        total=end,
        initial=run.step,
        desc=job.name,
        unit="step",
        disable=not progress or engine.rank != 0,
        dynamic_ncols=True,
    )
    while run.step < end:
        stopping, over_budget, timed = engine.agree(
            stop.requested,
            bool(budget_s) and clock() - started >= budget_s,
            bool(every_s) and time.monotonic() - run.checkpoint_time >= every_s,
        )
        if stopping or over_budget:
            break
        if timed and run.checkpoint_step != run.step:
            _save(job, run)
        poll_threads()
        step = run.step
        with nvtx_range(f"{job.name}_step"):
            values = _accumulate(job, engine, step)
            grad_norm = engine.step()
            lr = engine.lr  # the rate after this step's schedule update (at the end: the final rate)
        if run.ema is not None:
            with engine.full_parameters() as named:
                run.ema.update(named, step)
        run.step = step + 1
        run.values = values
        run.elapsed_s = clock() - started
        bar.update(1)
        bar.set_postfix(loss=f"{run.values['loss']:.4f}")
        extra = job.after_step(run.step, run.values, run)
        if run.log is not None and (run.step % settings.log_every == 0 or run.step == settings.steps or extra):
            run.log.append(
                {
                    "step": run.step,
                    **run.values,
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "elapsed_s": round(run.elapsed_s, 3),
                    **extra,
                }
            )
        kill_point("step")  # test hook: a kill after a step, before its checkpoint
        if run.step % settings.checkpoint_every == 0 or run.step == end:
            _save(job, run)
        job.step_done(run.step, run)
        paused = clock()
        yield run.step
        started += clock() - paused
    bar.close()
    if run.checkpoint_step != run.step:  # stopped (a signal, the time budget) between checkpoints
        _save(job, run)


def _accumulate(job: TrainingJob, engine: Engine, step: int) -> dict[str, float]:
    """Forward and backward of optimizer step ``step``'s micro-batches; the mean of each reported value."""
    accum = job.settings.grad_accum_steps
    totals: dict[str, float] = {}
    for micro in range(accum):
        losses = engine(**job.batch(step * accum + micro, engine))
        values = {k: float(v.detach()) if isinstance(v, torch.Tensor) else float(v) for k, v in losses.items()}
        if not math.isfinite(values["loss"]):
            raise FloatingPointError(
                f"non-finite loss {values['loss']} at step {step}"
                f"{f' (micro-batch {micro})' if accum > 1 else ''}: {values}"
            )
        engine.backward(losses["loss"])
        for k, v in values.items():
            totals[k] = totals.get(k, 0.0) + v
    return {k: v / accum for k, v in totals.items()} if accum > 1 else totals


def _save(job: TrainingJob, run: TrainingRun) -> None:
    """Checkpoint ``run`` at its current step (see :mod:`dihal_fast.train.checkpoint`), then the job's hook."""
    save_checkpoint(
        run.run_dir,
        run.step,
        run.engine,
        run.ema,
        {**job.configs, **job.derived},
        job.settings.keep_checkpoints,
        run.elapsed_s,
        job.stream_state(),
    )
    run.checkpoint_step, run.checkpoint_time = run.step, time.monotonic()
    job.on_checkpoint(run.step, run)
