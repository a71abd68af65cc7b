"""Loading local Hugging Face causal-LM checkpoints with errors a user can act on."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from dihal_fast.common.assets import model_location
from dihal_fast.errors import DihalValueError

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def resolve_model_dir(path: str | os.PathLike | None) -> Path:
    """``path`` checked to be a checkpoint directory: a directory, a shipped backbone's name
    (``tiny-qwen3-16l``; a directory of that name wins) or ``None`` (the default shipped backbone).
    Every command's ``--model`` goes through here."""
    path = model_location(path)
    if not path.is_dir() or not (path / "config.json").is_file():
        raise DihalValueError(f"{path} is not a Hugging Face checkpoint directory (no config.json)")
    try:
        json.loads((path / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DihalValueError(f"{path}/config.json is corrupt: {exc}") from None
    return path


def load_tokenizer(path: str | os.PathLike | None):
    """The tokenizer saved in directory ``path`` (or a shipped backbone's name; ``None`` = the default one's); a
    missing pad token
    is set to EOS (and said so in the log). The one tokenizer loader of the package."""
    from transformers import AutoTokenizer

    path = model_location(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory not found: {path}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as exc:
        raise DihalValueError(f"could not load a tokenizer from {path}: {exc}") from None
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise DihalValueError(f"the tokenizer in {path} has neither a pad nor an eos token; add a pad token")
        logger.info("tokenizer has no pad token; using eos (%r) for padding", tokenizer.eos_token)
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def placement(device, device_map: str = "none") -> dict:
    """``from_pretrained`` keyword arguments placing a checkpoint on torch device ``device`` (resolved).

    ``device_map="none"``: the whole model on ``device``; on a GPU through accelerate when it is installed, so the
    shards load straight into GPU memory instead of being staged in host memory first. A strategy of
    :data:`~dihal_fast.common.devices.DEVICE_MAP_CHOICES` (``auto``, ``balanced``, ...): accelerate spreads the
    layers over this rank's GPUs (:func:`~dihal_fast.common.devices.rank_gpus`; on ``cpu``: the CPU alone) and
    then the rank's share of host memory, through ``max_memory`` (each rank sees all of its node's GPUs, as torchrun
    and the deepspeed launcher leave them); a model spread over several places holds ``hf_device_map``. A JSON map
    (:func:`~dihal_fast.common.devices.parse_device_map`) is passed as given, once it names only this rank's GPUs.
    """
    import torch
    from transformers.utils import is_accelerate_available

    from dihal_fast.common.devices import (
        check_map_devices,
        parse_device_map,
        rank_gpus,
        rank_max_memory,
        ranks_per_node,
    )
    from dihal_fast.common.launch import launcher_env

    spec = parse_device_map(device_map)
    if spec == "none":
        return {"device_map": {"": str(device)}} if device.type == "cuda" and is_accelerate_available() else {}
    if not is_accelerate_available():
        raise DihalValueError(f"--device-map {device_map} needs accelerate: pip install 'dihal_fast[deepspeed]'")
    if device.index is not None:
        raise DihalValueError(
            f"--device-map {device_map} spreads the model over this rank's GPUs, --device {device} pins one; pass "
            "--device cuda (or auto), or --device-map none"
        )
    import psutil  # type: ignore[import-untyped]  # an accelerate dependency

    local_ranks = ranks_per_node()
    gpus = (
        rank_gpus(torch.cuda.device_count(), launcher_env().local_rank, local_ranks) if device.type == "cuda" else None
    )
    if isinstance(spec, dict):
        check_map_devices(spec, gpus)
        return {"device_map": spec}
    # Free memory of this rank's GPUs only: querying a GPU opens a CUDA context on it, in every rank that asks.
    free: dict[int | str, int] = {gpu: torch.cuda.mem_get_info(gpu)[0] for gpu in gpus or []}
    free["cpu"] = psutil.virtual_memory().available
    return {"device_map": spec, "max_memory": rank_max_memory(free, gpus, local_ranks)}


def input_device(model) -> torch.device:
    """Where a model's inputs go: the device of its input embedding (the first device of a spread model)."""
    return model.get_input_embeddings().weight.device


def load_causal_lm(
    path: str | os.PathLike | None, dtype: str = "float32", device: str = "cpu", device_map: str = "none"
):
    """``(model, tokenizer)`` from a local checkpoint directory, in eval mode on ``device`` (``auto`` or a torch
    device) and ``dtype`` (``auto`` = the checkpoint's own; see :mod:`dihal_fast.common.devices`); ``device_map``
    spreads it over this rank's devices instead (:func:`placement`; inputs go to :func:`input_device`)."""
    from transformers import AutoModelForCausalLM

    from dihal_fast.common.devices import resolve_device, resolve_dtype

    if dtype != "auto" and dtype not in DTYPES:
        raise DihalValueError(f"dtype must be auto or one of {sorted(DTYPES)}, got {dtype!r}")
    device = resolve_device(str(device))
    where = placement(device, device_map)
    path = resolve_model_dir(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype, path), **where)
    except Exception as exc:  # transformers/safetensors raise many types for a bad checkpoint
        raise DihalValueError(f"could not load a causal LM from {path}: {type(exc).__name__}: {exc}") from None
    tokenizer = load_tokenizer(path)
    if device_map == "none":
        model = model.to(device)
    return model.eval(), tokenizer
