"""The one ``--device`` / ``--dtype`` handling of every command and stage config.

``device_option()`` and ``dtype_option()`` declare the fields (``auto`` by default everywhere);
:func:`resolve_device` and :func:`resolve_dtype` turn them into torch objects before any work starts,
refusing what this machine cannot run with one line. ``--dtype auto`` is the checkpoint's own dtype
(``dtype`` / ``torch_dtype`` in its ``config.json``), as transformers' ``from_pretrained(dtype="auto")``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dihal_fast.common.options import option

DEVICE_HELP = "torch device: auto (cuda when torch sees one, else cpu), cpu, cuda or cuda:N"
DTYPE_HELP = "model dtype: auto (the checkpoint's own, from its config.json), float32, bfloat16, float16 or float64"
DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64")
DTYPE_CHOICES = ("auto", *DTYPE_NAMES)
_CHECKPOINT_DEFAULT = "float32"  # transformers' default when a config names no dtype


def device_option(default: str = "auto", help: str = DEVICE_HELP):
    """The ``device`` field of a stage config (``--device``): checked by :func:`resolve_device` when the config
    is built (see :mod:`dihal_fast.common.validation`)."""
    return option(default, help, device=True)


def dtype_option(default: str = "auto", help: str = DTYPE_HELP):
    """The ``dtype`` field of a stage config (``--dtype``), choices :data:`DTYPE_CHOICES`."""
    return option(default, help, choices=DTYPE_CHOICES)


def resolve_device(name: str):
    """``torch.device`` for ``name`` (``auto`` = the first CUDA device when torch sees one, else cpu).

    A CUDA device that torch cannot see, or any other device type, is a ValueError naming the fix.
    """
    import torch

    if not isinstance(name, str):
        raise TypeError(f"device must be a string (auto, cpu, cuda, cuda:N), got {type(name).__name__}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r} is not a torch device (expected auto, cpu, cuda or cuda:N)") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name}: only cpu and cuda are supported, got {device.type}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name} asked for, but torch sees no CUDA device here; use --device cpu or auto")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(
            f"device {name} asked for, but torch sees {torch.cuda.device_count()} CUDA device(s) "
            f"(cuda:0..cuda:{torch.cuda.device_count() - 1})"
        )
    return device


def checkpoint_dtype_name(model_dir: str | os.PathLike) -> str:
    """The dtype a checkpoint's ``config.json`` declares (``dtype``, else ``torch_dtype``), float32 if none."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"--dtype auto reads the checkpoint's dtype, but {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is corrupt: {exc}") from None
    declared = config.get("dtype") or config.get("torch_dtype") or _CHECKPOINT_DEFAULT
    declared = str(declared).replace("torch.", "")
    if declared not in DTYPE_NAMES:
        raise ValueError(f"{path} declares dtype {declared!r}; pass --dtype with one of {', '.join(DTYPE_NAMES)}")
    return declared


def dtype_name(name: str, model_dir: str | os.PathLike | None = None) -> str:
    """The concrete dtype name ``name`` stands for (``auto`` = :func:`checkpoint_dtype_name` of ``model_dir``)."""
    if name == "auto":
        if model_dir is None:
            raise ValueError("--dtype auto needs a checkpoint directory to read the dtype from")
        return checkpoint_dtype_name(model_dir)
    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {name!r}")
    return name


def resolve_dtype(name: str, model_dir: str | os.PathLike | None = None):
    """``torch.dtype`` for ``name`` (see :func:`dtype_name`)."""
    import torch

    return getattr(torch, dtype_name(name, model_dir))
