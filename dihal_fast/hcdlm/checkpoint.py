"""Checkpoints: ``RUN/ckpt-<step>/`` holds ``model.safetensors``, ``ema.safetensors``, ``config.json`` and
``state.pt`` (optimizer, step, random states); ``RUN/latest.json`` names the newest complete one."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dihal_fast.common import atomic_write_json, read_json
from dihal_fast.hcdlm.config import RunConfig
from dihal_fast.train.engines import load_checked

LATEST = "latest.json"


def save_checkpoint(run_dir: Path, step: int, config: RunConfig, model: torch.nn.Module, ema: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, task_rng: random.Random, generator: torch.Generator,
                    elapsed_s: float, keep: int = 2) -> Path:
    """Write a complete checkpoint, then point ``latest.json`` at it and drop all but the ``keep`` newest."""
    folder = run_dir / f"ckpt-{step:08d}"
    tmp = run_dir / f".tmp-ckpt-{step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp / "model.safetensors")
    save_file({k: v.contiguous() for k, v in ema.state_dict().items()}, tmp / "ema.safetensors")
    config.save(tmp / "config.json")
    torch.save({"step": step, "optimizer": optimizer.state_dict(), "task_rng": task_rng.getstate(),
                "generator": generator.get_state(),
                "generator_device": generator.device.type, "torch_rng": torch.get_rng_state(), "elapsed_s": elapsed_s},
               tmp / "state.pt")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    atomic_write_json(run_dir / LATEST, {"checkpoint": folder.name, "step": step})
    for old in sorted(run_dir.glob("ckpt-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder of a run, or None when there is none yet."""
    pointer = run_dir / LATEST
    if not pointer.is_file():
        return None
    folder = run_dir / read_json(pointer, "checkpoint pointer")["checkpoint"]
    if not (folder / "state.pt").is_file():
        raise FileNotFoundError(f"{pointer} names {folder}, which is missing or incomplete")
    return folder


def load_weights(module: torch.nn.Module, path: Path) -> None:
    """Load a safetensors file into ``module``; a missing, truncated or mismatched file is a ValueError."""
    tensors = load_checked(path, lambda p: load_file(str(p)))
    try:
        module.load_state_dict(tensors)
    except RuntimeError as exc:
        raise ValueError(f"checkpoint file {path} does not fit this run's model: {str(exc).splitlines()[0]}") from None


def load_state(folder: Path) -> dict:
    """The optimizer / step / random states of a checkpoint folder (ValueError when corrupt)."""
    return load_checked(folder / "state.pt", lambda p: torch.load(p, weights_only=False))
