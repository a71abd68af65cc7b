"""The one checkpoint layout of every training family (backbone, bridge, HC-DLM)::

    RUN/checkpoints/step_NNNNNNNN/
        weights.safetensors        the trainable parameters, full values (gathered under ZeRO-3)
        ema.safetensors            their EMA (when the run keeps one)
        engine/                    optimizer + LR schedule (ZeRO partitions under DeepSpeed)
        rng_rank<R>.safetensors    torch (and CUDA) random state of rank R
        rng_rank<R>.json           NumPy and Python random state of rank R
        stream.json, stream.safetensors   the family's own data / noise streams (rank 0)
        <name>.json                the family's configs (e.g. train_config.json), compared on resume
        state.json                 step, engine, world size, training time so far
    RUN/checkpoints/latest         the name of the newest complete checkpoint

A checkpoint is written into a hidden temporary folder and renamed when complete, so a crash leaves the
previous one intact; resuming checks everything it can before any training starts. Nothing is pickled:
tensors are safetensors, the rest JSON (the optimizer state goes through ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from safetensors.torch import save_file as _save_safetensors

from dihal_fast.common import atomic_write_bytes, atomic_write_json, read_json
from dihal_fast.common.io import follow_umask, kill_point, replace_directory, temporary_directory, writing
from dihal_fast.errors import DihalValueError
from dihal_fast.train.ema import EMA
from dihal_fast.train.engines import Engine, load_checked

WEIGHTS, EMA_WEIGHTS = "weights.safetensors", "ema.safetensors"


def save_file(tensors: dict[str, torch.Tensor], path: str) -> None:
    """safetensors' ``save_file`` with ``open()``'s permissions (it writes ``0600``), a failed write one
    :class:`~dihal_fast.errors.DihalIOError` naming ``path``."""
    with writing(path):
        _save_safetensors(tensors, path)
    follow_umask(path)


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


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
        raise DihalValueError(
            f"{pointer} {problem} instead of a checkpoint folder name (step_NNNNNNNN; {newest}); "
            "the run directory is damaged"
        )
    path = root / name
    if not path.is_dir():
        raise DihalValueError(f"{pointer} names {path.name}, which does not exist; the run directory is damaged")
    return path


def checkpoint_state(path: Path) -> dict:
    """``state.json`` of a checkpoint: step, engine, world size, training seconds, the family's stream state."""
    return read_json(path / "state.json", "checkpoint state")


def check_resumable(
    path: Path, configs: dict[str, dict], resumable: Iterable[str], engine_kind: str, world_size: int, steps: int
) -> int:
    """Validate a checkpoint against this run before anything is built; returns its step.

    ``configs`` are this run's configs by file name; a field that differs from the saved one refuses the
    resume unless its name is in ``resumable`` (fields that do not change what a step computes).
    """
    state = checkpoint_state(path)
    allowed = set(resumable)
    for name, config in configs.items():
        saved = read_json(path / name, "checkpoint config")
        if not isinstance(saved, dict):
            raise DihalValueError(
                f"checkpoint config {path / name} holds a JSON {type(saved).__name__}, not an object; "
                "the checkpoint is damaged"
            )
        differing = sorted(k for k in set(saved) | set(config) if k not in allowed and saved.get(k) != config.get(k))
        if differing:
            sections = [k for k in differing if isinstance(config.get(k), dict)]
            which = f" (a different {' and '.join(sections)} configuration)" if sections else ""
            saved_sections = {k: saved[k] if isinstance(saved.get(k), dict) else {} for k in sections}
            fields = [
                f"{k}.{f}"
                for k in sections
                for f in sorted(set(saved_sections[k]) | set(config[k]))
                if saved_sections[k].get(f) != config[k].get(f)
            ]
            raise DihalValueError(
                f"checkpoint {path} was written with different settings for {fields or differing}{which}; "
                "resume with the same settings or start a new --out directory"
            )
    if state.get("engine") != engine_kind:
        raise DihalValueError(
            f"checkpoint {path} was written by the {state.get('engine')!r} engine, this run uses {engine_kind!r}"
        )
    if state.get("world_size") != world_size:
        raise DihalValueError(
            f"checkpoint {path} was written by {state.get('world_size')} processes; resume with the same number, not "
            f"{world_size}"
        )
    if not isinstance(state.get("step"), int) or not 0 < state["step"] <= steps:
        raise DihalValueError(f"checkpoint {path} has step {state.get('step')!r}, outside 1..{steps} (--steps)")
    if not (path / WEIGHTS).exists() and (path / "engine" / "trainable.safetensors").exists():
        raise DihalValueError(
            f"checkpoint {path} was written by an earlier dihal_fast (weights in engine/trainable.safetensors); "
            "this version cannot resume it: train again into a new --out"
        )
    for name in (WEIGHTS, "engine"):
        if not (path / name).exists():
            raise DihalValueError(f"checkpoint {path} is incomplete: {name} is missing")
    return state["step"]


def _rng_state() -> tuple[dict, dict]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    keys = np.asarray(keys)  # a uint32 array already; typed as a union by NumPy's stubs
    python = random.getstate()
    return tensors, {
        "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
        "python": [python[0], list(python[1]), python[2]],
    }


def _set_rng_state(tensors: dict, plain: dict) -> None:
    torch.set_rng_state(tensors["torch"])
    if torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in sorted(k for k in tensors if k.startswith("cuda"))])
    kind, keys, pos, has_gauss, cached = plain["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, state, gauss = plain["python"]
    random.setstate((version, tuple(state), gauss))


def save_checkpoint(
    run_dir: Path,
    step: int,
    engine,
    ema: EMA | None,
    configs: dict[str, dict],
    keep: int,
    elapsed_s: float = 0.0,
    stream: tuple[dict, dict[str, torch.Tensor]] = ({}, {}),
) -> Path:
    """Write checkpoint ``step`` (collective under DeepSpeed), point ``latest`` at it, prune all but ``keep``."""
    root = checkpoints_dir(run_dir)
    name = f"step_{step:08d}"
    final = root / name
    tmp = temporary_directory(final) if engine.rank == 0 else root / f".tmp_{name}"
    engine.barrier()
    try:
        _write_checkpoint(tmp, step, engine, ema, configs, elapsed_s, stream)
    except BaseException:  # a full disk or a kill signal: the previous checkpoint stays the latest, no folder is left
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    engine.barrier()
    if engine.rank == 0:
        replace_directory(tmp, final)
        atomic_write_bytes(root / "latest", name.encode())
        for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
            shutil.rmtree(old)
    engine.barrier()
    return final


def _write_checkpoint(
    tmp: Path,
    step: int,
    engine,
    ema: EMA | None,
    configs: dict[str, dict],
    elapsed_s: float,
    stream: tuple[dict, dict[str, torch.Tensor]],
) -> None:
    """Fill the fresh folder ``tmp`` with checkpoint ``step`` (see the module docstring)."""
    engine.save(tmp / "engine")
    kill_point("checkpoint")  # test hook: a kill while the checkpoint is half-written
    with engine.full_parameters() as named:
        if engine.rank == 0:
            save_file({n: p.detach().contiguous().cpu() for n, p in named}, str(tmp / WEIGHTS))
    tensors, plain = _rng_state()
    save_file(tensors, str(tmp / f"rng_rank{engine.rank}.safetensors"))
    atomic_write_json(tmp / f"rng_rank{engine.rank}.json", plain)
    if engine.rank == 0:
        if ema is not None:
            save_file(ema.state_dict(), str(tmp / EMA_WEIGHTS))
        stream_plain, stream_tensors = stream
        atomic_write_json(tmp / "stream.json", stream_plain)
        save_file({k: v.contiguous() for k, v in stream_tensors.items()}, str(tmp / "stream.safetensors"))
        for file_name, config in configs.items():
            atomic_write_json(tmp / file_name, config)
        atomic_write_json(
            tmp / "state.json",
            {"step": step, "engine": engine.kind, "world_size": engine.world_size, "elapsed_s": elapsed_s},
        )


def load_weights(path: Path, use_ema: bool = False) -> dict[str, torch.Tensor]:
    """The trainable parameters (or their EMA) saved in checkpoint ``path``; a damaged file is a ValueError."""
    return load_checked(path / (EMA_WEIGHTS if use_ema else WEIGHTS), lambda p: load_file(str(p)))


def load_checkpoint(path: Path, engine: Engine, ema: EMA | None) -> tuple[int, dict, tuple[dict, dict]]:
    """Restore weights, engine, EMA and this rank's RNG from ``path``.

    Returns the step to continue from, the saved ``state.json`` and the family's stream state.
    """
    state = checkpoint_state(path)
    weights = load_weights(path)
    with engine.full_parameters() as named, torch.no_grad():
        names = [n for n, _ in named]
        if sorted(weights) != sorted(names) or any(weights[n].shape != p.shape for n, p in named):
            raise DihalValueError(
                f"checkpoint {path} holds parameters {sorted(weights)[:4]}..., not this run's {names[:4]}..."
            )
        for n, p in named:
            p.copy_(weights[n])
    engine.load(path / "engine")
    if ema is not None:
        ema.load_state_dict(load_checked(path / EMA_WEIGHTS, lambda p: load_file(str(p))))
    tensors = load_checked(path / f"rng_rank{engine.rank}.safetensors", lambda p: load_file(str(p)))
    plain = load_checked(path / f"rng_rank{engine.rank}.json", lambda p: json.loads(p.read_text()))
    try:
        _set_rng_state(tensors, plain)
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError, OverflowError) as exc:  # wrong types or sizes
        raise DihalValueError(
            f"the random state in {path}/rng_rank{engine.rank}.* is damaged ({type(exc).__name__}: "
            f"{exc}); resume from another checkpoint or train into a new --out"
        ) from None
    stream = (
        load_checked(path / "stream.json", lambda p: json.loads(p.read_text())),
        load_checked(path / "stream.safetensors", lambda p: load_file(str(p))),
    )
    return state["step"], state, stream
