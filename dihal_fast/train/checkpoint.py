"""Checkpoints of a bridge training run: ``RUN/checkpoints/step_NNNNNNNN/`` holding the engine's state
(weights, optimizer, LR schedule; ZeRO partitions under DeepSpeed), the EMA, every rank's RNG state, the
step (which is also the data position) and the configs; ``RUN/checkpoints/latest`` names the newest.

A checkpoint is written into a hidden temporary folder and renamed when complete, so a crash leaves the
previous one intact; resuming checks everything it can before any training starts.
"""
from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from dihal_fast.common import atomic_write_bytes, atomic_write_json, read_json
from dihal_fast.train.config import TrainConfig
from dihal_fast.train.ema import EMA
from dihal_fast.train.engines import load_checked

# Fields that may change between a run and its resumption (they do not change what a step computes).
RESUMABLE_CHANGES = {"steps", "log_every", "eval_every", "save_every", "keep_checkpoints", "device"}


def checkpoints_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of ``run_dir``, or None when there is none."""
    root = checkpoints_dir(run_dir)
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    name = pointer.read_text(errors="replace").strip()
    if not re.fullmatch(r"step_\d+", name):
        found = sorted(p.name for p in root.glob("step_*") if p.is_dir())
        newest = f"the newest checkpoint folder there is {found[-1]}" if found else "there is no checkpoint folder"
        problem = "is empty" if not name else f"holds {name[:40]!r}"
        raise ValueError(f"{pointer} {problem} instead of a checkpoint folder name (step_NNNNNNNN; {newest}); "
                         "the run directory is damaged")
    path = root / name
    if not path.is_dir():
        raise ValueError(f"{pointer} names {path.name}, which does not exist; the run directory is damaged")
    return path


def check_resumable(path: Path, config: TrainConfig, engine_kind: str, world_size: int) -> int:
    """Validate a checkpoint against this run before anything is built; returns its step."""
    state = read_json(path / "state.json", "checkpoint state")
    saved = TrainConfig.from_dict(read_json(path / "train_config.json", "checkpoint train config")).to_dict()
    differing = sorted(k for k in saved if k not in RESUMABLE_CHANGES and saved[k] != config.to_dict()[k])
    if differing:
        raise ValueError(f"checkpoint {path} was written with different settings for {differing}; resume with the "
                         "same settings or start a new --out directory")
    if state.get("engine") != engine_kind:
        raise ValueError(f"checkpoint {path} was written by the {state.get('engine')!r} engine, this run uses {engine_kind!r}")
    if state.get("world_size") != world_size:
        raise ValueError(f"checkpoint {path} was written by {state.get('world_size')} processes; resume with the same number, not {world_size}")
    if not isinstance(state.get("step"), int) or not 0 < state["step"] <= config.steps:
        raise ValueError(f"checkpoint {path} has step {state.get('step')!r}, outside 1..{config.steps} (--steps)")
    for name in ("ema.safetensors", "engine"):
        if not (path / name).exists():
            raise ValueError(f"checkpoint {path} is incomplete: {name} is missing")
    return state["step"]


def _rng_state() -> tuple[dict, dict]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    python = random.getstate()
    return tensors, {"numpy": [kind, keys.tolist(), pos, has_gauss, cached], "python": [python[0], list(python[1]), python[2]]}


def _set_rng_state(tensors: dict, plain: dict) -> None:
    torch.set_rng_state(tensors["torch"])
    if torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in sorted(k for k in tensors if k.startswith("cuda"))])
    kind, keys, pos, has_gauss, cached = plain["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, state, gauss = plain["python"]
    random.setstate((version, tuple(state), gauss))


def save_checkpoint(run_dir: Path, step: int, engine, ema: EMA, config: TrainConfig, bridge_config: dict) -> Path:
    """Write checkpoint ``step`` (collective under DeepSpeed), point ``latest`` at it, prune old ones."""
    root = checkpoints_dir(run_dir)
    name = f"step_{step:08d}"
    tmp, final = root / f".tmp_{name}", root / name
    if engine.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    engine.barrier()
    engine.save(tmp / "engine")
    tensors, plain = _rng_state()
    save_file(tensors, str(tmp / f"rng_rank{engine.rank}.safetensors"))
    atomic_write_json(tmp / f"rng_rank{engine.rank}.json", plain)
    if engine.rank == 0:
        save_file(ema.state_dict(), str(tmp / "ema.safetensors"))
        atomic_write_json(tmp / "train_config.json", config.to_dict())
        atomic_write_json(tmp / "bridge_config.json", bridge_config)
        atomic_write_json(tmp / "state.json", {"step": step, "engine": engine.kind, "world_size": engine.world_size})
    engine.barrier()
    if engine.rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        atomic_write_bytes(root / "latest", name.encode())
        for old in sorted(p for p in root.glob("step_*") if p.is_dir())[: -config.keep_checkpoints]:
            shutil.rmtree(old)
    engine.barrier()
    return final


def load_checkpoint(path: Path, engine, ema: EMA) -> int:
    """Restore engine, EMA and this rank's RNG from ``path``; returns the step to continue from."""
    step = read_json(path / "state.json", "checkpoint state")["step"]
    engine.load(path / "engine")
    ema.load_state_dict(load_checked(path / "ema.safetensors", lambda p: load_file(str(p))))
    tensors = load_checked(path / f"rng_rank{engine.rank}.safetensors", lambda p: load_file(str(p)))
    plain = load_checked(path / f"rng_rank{engine.rank}.json", lambda p: json.loads(p.read_text()))
    _set_rng_state(tensors, plain)
    return step

