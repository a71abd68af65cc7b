"""The one ``--device`` / ``--dtype`` handling of every command and stage config.

``device_option()`` and ``dtype_option()`` declare the fields (``auto`` by default everywhere);
:func:`resolve_device` and :func:`resolve_dtype` turn them into torch objects before any work starts,
refusing what this machine cannot run with one line. ``--dtype auto`` is the checkpoint's own dtype
(``dtype`` / ``torch_dtype`` in its ``config.json``), as transformers' ``from_pretrained(dtype="auto")``.
``device_map_option()`` (``--device-map``) places a checkpoint's layers across this process's devices with
accelerate's strategies (:func:`rank_gpus`, :func:`rank_max_memory`: one disjoint set of GPUs per rank of a node)
or an explicit JSON map (:func:`parse_device_map`, :func:`check_map_devices`).
:func:`device_argument` is the same device check as an argparse ``type`` for commands without a config field.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

from dihal_fast.common.json_input import parse_json
from dihal_fast.common.options import option
from dihal_fast.errors import DihalError, DihalTypeError, DihalValueError

DEVICE_HELP = "torch device: auto (cuda when torch sees one, else cpu), cpu, cuda or cuda:N"
DTYPE_HELP = "model dtype: auto (the checkpoint's own, from its config.json), float32, bfloat16, float16 or float64"
DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64")
DTYPE_CHOICES = ("auto", *DTYPE_NAMES)
_CHECKPOINT_DEFAULT = "float32"  # transformers' default when a config names no dtype
# A hybrid's bridge: auto (the retained part's dtype, float32 beside float16: a bf16 hybrid runs its bridge at the
# bf16 rate, half the bytes, logits within bf16 rounding) or float32 (the dtype it trains in).
BRIDGE_DTYPES = ("float32", "auto")
DEVICE_MAP_CHOICES = ("none", "auto", "balanced", "balanced_low_0", "sequential")
DEVICE_MAP_HELP = (
    "placement of a checkpoint's layers: none (the whole model on --device), an accelerate strategy (auto, "
    "balanced, balanced_low_0, sequential) spreading it over this process's GPUs, then the CPU, or a JSON map of "
    'module names to devices (\'{"": "cpu"}\', \'{"model.embed_tokens": 0, ..., "lm_head": 1}\': GPU indices, '
    '"cuda:N" or "cpu"); under a launcher rank r of n on a node takes GPUs r, r+n, r+2n, ... (needs accelerate; '
    "not with DeepSpeed)"
)
# The variables that say how many processes run on this node: torchrun, the deepspeed launcher, SLURM.
RANKS_PER_NODE_VARS = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")


def device_option(default: str = "auto", help: str = DEVICE_HELP):
    """The ``device`` field of a stage config (``--device``): checked by :func:`resolve_device` when the config
    is built (see :mod:`dihal_fast.common.validation`)."""
    return option(default, help, device=True)


def dtype_option(default: str = "auto", help: str = DTYPE_HELP):
    """The ``dtype`` field of a stage config (``--dtype``), choices :data:`DTYPE_CHOICES`."""
    return option(default, help, choices=DTYPE_CHOICES)


def bridge_dtype_option(models: str = "a hybrid's bridge"):
    """The ``bridge_dtype`` field of a stage config (``--bridge-dtype``): None keeps each hybrid's own."""
    return option(
        None,
        f"{models} in auto (the retained layers' dtype, float32 beside float16: a bf16 hybrid runs it at the bf16 "
        "rate, logits within bf16 rounding) or float32 (the dtype it trains in); default: as the hybrid was saved "
        "(auto unless saved otherwise)",
        choices=BRIDGE_DTYPES,
    )


def device_map_option(default: str = "none", help: str = DEVICE_MAP_HELP):
    """The ``device_map`` field of a stage config (``--device-map``): a strategy of :data:`DEVICE_MAP_CHOICES` or
    a JSON map, checked by :func:`parse_device_map` when the config is built."""
    return option(default, help, device_map=True, metavar="MAP")


def parse_device_map(text: str) -> str | dict[str, int | str]:
    """``text`` as ``from_pretrained(device_map=...)`` takes it: a strategy of :data:`DEVICE_MAP_CHOICES` as is, or
    a JSON object ``{module name: device}`` with each device a GPU index (``0``, ``"cuda:0"``) or ``"cpu"``
    (GPU indices as ints). Anything else is one ValueError naming what was expected."""
    if not isinstance(text, str):
        raise DihalTypeError(f"--device-map must be a string, got {type(text).__name__}")
    if text in DEVICE_MAP_CHOICES:
        return text
    expected = f"one of {', '.join(DEVICE_MAP_CHOICES)} or a JSON object of module names to devices"
    if not text.lstrip().startswith("{"):
        raise DihalValueError(f"--device-map must be {expected}, got {_shown(text)}")
    spec = parse_json(text, f"--device-map {_shown(text)}")
    if not isinstance(spec, dict) or not spec:
        raise DihalValueError(f"--device-map must be {expected}, got {_shown(text)}")
    parsed: dict[str, int | str] = {}
    for name, value in spec.items():
        if value == "cpu":
            parsed[name] = "cpu"
        elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            parsed[name] = value
        elif isinstance(value, str) and value.startswith("cuda:") and value[5:].isdigit():
            parsed[name] = int(value[5:])
        else:
            raise DihalValueError(
                f'--device-map: module {name!r} is mapped to {value!r}; a device is a GPU index (0, "cuda:0") or '
                '"cpu" (disk offload needs an offload folder, which no command sets)'
            )
    return parsed


def _shown(text: str, limit: int = 80) -> str:
    """``repr(text)``, cut to ``limit`` characters so that a one-line error stays one readable line."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def check_map_devices(spec: Mapping[str, int | str], gpus: list[int] | None) -> None:
    """Refuse a JSON map (:func:`parse_device_map`) naming a GPU outside ``gpus``: this rank's GPUs
    (:func:`rank_gpus`; ``None``: the process runs on the CPU and may name no GPU)."""
    named = sorted({value for value in spec.values() if isinstance(value, int)})
    if named and gpus is None:
        raise DihalValueError(f"--device-map names GPU(s) {named}, but this process runs on the CPU (--device cpu)")
    outside = [gpu for gpu in named if gpu not in (gpus or [])]
    if outside:
        raise DihalValueError(
            f"--device-map names GPU(s) {outside}, outside this rank's GPUs {gpus} (rank r of n on a node owns GPUs "
            "r, r+n, ...; torch numbers the GPUs it sees)"
        )


def device_argument(text: str) -> str:
    """``--device`` as an argparse ``type``: ``text`` when :func:`resolve_device` accepts it, else a usage error
    (one line) while the command line is parsed, before any work."""
    try:
        resolve_device(text)
    except DihalError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def resolve_device(name: str):
    """``torch.device`` for ``name`` (``auto`` = the first CUDA device when torch sees one, else cpu).

    A CUDA device that torch cannot see, or any other device type, is a ValueError naming the fix.
    """
    import torch

    if not isinstance(name, str):
        raise DihalTypeError(f"device must be a string (auto, cpu, cuda, cuda:N), got {type(name).__name__}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise DihalValueError(f"device {name!r} is not a torch device (expected auto, cpu, cuda or cuda:N)") from exc
    if device.type not in ("cpu", "cuda"):
        raise DihalValueError(f"device {name}: only cpu and cuda are supported, got {device.type}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DihalValueError(f"device {name} asked for, but torch sees no CUDA device here; use --device cpu or auto")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise DihalValueError(
            f"device {name} asked for, but torch sees {torch.cuda.device_count()} CUDA device(s) "
            f"(cuda:0..cuda:{torch.cuda.device_count() - 1})"
        )
    return device


def checkpoint_dtype_name(model_dir: str | os.PathLike) -> str:
    """The dtype a checkpoint's ``config.json`` declares (``dtype``, else ``torch_dtype``), float32 if none."""
    path = Path(model_dir) / "config.json"
    try:
        config = parse_json(path.read_bytes(), f"{path} (read for --dtype auto)")
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"--dtype auto reads the checkpoint's dtype, but {path} does not exist") from exc
    if not isinstance(config, dict):
        raise DihalValueError(f"{path} holds {type(config).__name__}, expected a JSON object of model settings")
    declared = config.get("dtype") or config.get("torch_dtype") or _CHECKPOINT_DEFAULT
    declared = str(declared).replace("torch.", "")
    if declared not in DTYPE_NAMES:
        raise DihalValueError(f"{path} declares dtype {declared!r}; pass --dtype with one of {', '.join(DTYPE_NAMES)}")
    return declared


def dtype_name(name: str, model_dir: str | os.PathLike | None = None) -> str:
    """The concrete dtype name ``name`` stands for (``auto`` = :func:`checkpoint_dtype_name` of ``model_dir``)."""
    if name == "auto":
        if model_dir is None:
            raise DihalValueError("--dtype auto needs a checkpoint directory to read the dtype from")
        return checkpoint_dtype_name(model_dir)
    if name not in DTYPE_NAMES:
        raise DihalValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {name!r}")
    return name


def resolve_dtype(name: str, model_dir: str | os.PathLike | None = None):
    """``torch.dtype`` for ``name`` (see :func:`dtype_name`)."""
    import torch

    return getattr(torch, dtype_name(name, model_dir))


def ranks_per_node(env: Mapping[str, str] | None = None) -> int:
    """How many processes of this job run on this node: ``LOCAL_WORLD_SIZE`` (torchrun), ``LOCAL_SIZE`` (the
    deepspeed launcher) or ``SLURM_NTASKS_PER_NODE``; 1 without a launcher (``WORLD_SIZE`` unset or 1)."""
    env = os.environ if env is None else env
    for name in RANKS_PER_NODE_VARS:
        value = env.get(name, "")
        if value:
            if not value.isdigit() or int(value) < 1:
                raise DihalValueError(f"{name} must be an integer >= 1, got {value!r}")
            return int(value)
    world = env.get("WORLD_SIZE", "1") or "1"
    if world.isdigit() and int(world) <= 1:
        return 1
    raise DihalValueError(
        f"--device-map under a launcher (WORLD_SIZE={world}) needs the number of ranks on this node "
        f"({', '.join(RANKS_PER_NODE_VARS)}); torchrun and the deepspeed launcher set it, set one by hand otherwise"
    )


def rank_gpus(n_gpus: int, local_rank: int, local_ranks: int) -> list[int]:
    """The GPUs local rank ``local_rank`` of ``local_ranks`` on a node with ``n_gpus`` places its model on:
    ``local_rank, local_rank + local_ranks, ...`` (disjoint between ranks; the first is the rank's own
    ``cuda:LOCAL_RANK``, where DeepSpeed and torchrun put it). A rank without a GPU is a ValueError."""
    if not 0 <= local_rank < local_ranks:
        raise DihalValueError(
            f"local rank {local_rank} must lie in 0..{local_ranks - 1} ({local_ranks} ranks per node)"
        )
    if local_rank >= n_gpus:
        raise DihalValueError(
            f"--device-map: local rank {local_rank} of {local_ranks} on this node has no GPU (torch sees {n_gpus}); "
            "run at most one rank per GPU"
        )
    return list(range(local_rank, n_gpus, local_ranks))


def rank_max_memory(free: Mapping[int | str, int], gpus: list[int] | None, local_ranks: int) -> dict[int | str, int]:
    """accelerate's ``max_memory`` for one rank: the free memory (``free``, as ``accelerate.utils.get_max_memory``
    gives it) of its ``gpus`` only (``None``: no GPU, the CPU alone) and its share of the host memory."""
    memory: dict[int | str, int] = {gpu: int(free[gpu]) for gpu in gpus or []}
    memory["cpu"] = int(free["cpu"]) // local_ranks
    return memory
