"""``dihal replace --device-map``: the frozen teacher (and the retained layers the hybrid shares with it) spread
over one process's GPUs, for a backbone larger than one GPU.

The teacher loads through the one loader (:func:`dihal_fast.common.hf_loading.load_causal_lm`); the hybrid's
retained part then runs where the teacher's layers are (:func:`dihal_fast.hybrid.slicing.place_like_backbone`),
and the bridge, its condition and every loss term live on the device of the input embedding
(:func:`training_device`). What cannot work is refused in one line before any weights load
(:func:`check_replace_placement`) or, for a strategy that ran out of GPU memory, right after the teacher loads
(:func:`check_teacher_placed`).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from dihal_fast.common.devices import resolve_device
from dihal_fast.common.hf_loading import input_device, placement, resolve_model_dir
from dihal_fast.errors import DihalValueError

# Why a device map and DeepSpeed exclude each other (the refusal's text).
WITH_DEEPSPEED = (
    "--device-map cannot be combined with --deepspeed: the DeepSpeed engine moves the whole module onto the rank's "
    "one GPU (module.to(cuda:LOCAL_RANK)) and ZeRO-3 partitions the parameters itself (transformers: 'DeepSpeed "
    "Zero-3 is not compatible with passing a device_map'); use --device-map in one process per node, or "
    "--deepspeed (ZeRO-3 to shard the trained parameters) with the whole teacher on each rank"
)


def check_replace_placement(
    model_dir: str | os.PathLike | None, device: str, device_map: str, deepspeed_config: object = None
) -> None:
    """Refuse in one line, before any weights load, a ``--device-map`` bridge training cannot run with: together
    with DeepSpeed (:data:`WITH_DEEPSPEED`), what the loader refuses (:func:`placement`), and a JSON map that
    leaves a parameter of the backbone without a device (the input embedding, which makes the bridge's condition,
    included) or that mixes ``cpu`` with GPUs (accelerate would offload the ``cpu`` part)."""
    if device_map == "none":
        return
    if deepspeed_config is not None:
        raise DihalValueError(WITH_DEEPSPEED)
    spec = placement(resolve_device(device), device_map)["device_map"]
    if not isinstance(spec, dict):
        return
    if "cpu" in spec.values() and len(set(spec.values())) > 1:
        raise DihalValueError(
            f"--device-map {device_map}: a map that puts some modules on cpu and others on GPUs makes accelerate "
            "offload the cpu part (its weights streamed in at each forward), which the hybrid's shared retained "
            "layers cannot train through; map every module to a GPU, or everything to cpu"
        )
    missing = unplaced_parameters(resolve_model_dir(model_dir), spec)
    if missing:
        raise DihalValueError(
            f"--device-map {device_map} gives no device to {len(missing)} parameter(s) of the backbone "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); name a module (or a prefix of it, "
            '"" for the whole model) for every parameter, the input embedding (the bridge\'s condition) included'
        )


def unplaced_parameters(model_dir: os.PathLike, spec: dict[str, int | str]) -> list[str]:
    """The backbone's parameter names that no key of ``spec`` covers (a key covers itself and the names under
    it; ``""`` covers all), from the model built on the meta device: no weights are read."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    if "" in spec:
        return []
    return [
        name
        for name, _ in model.named_parameters()
        if not any(name == key or name.startswith(key + ".") for key in spec)
    ]


def check_teacher_placed(backbone: nn.Module) -> None:
    """Refuse a teacher part of which accelerate offloaded (parameters on the meta device, streamed in by hooks:
    a strategy that found too little GPU memory); the hybrid shares those tensors and cannot train through them."""
    offloaded = [name for name, parameter in backbone.named_parameters() if parameter.device.type == "meta"]
    if offloaded:
        where = sorted({str(v) for v in getattr(backbone, "hf_device_map", {}).values()})
        raise DihalValueError(
            f"--device-map: the backbone does not fit on this process's GPUs; accelerate offloaded "
            f"{len(offloaded)} parameter(s) ({offloaded[0]}, ...; placed on {', '.join(where)}), which bridge "
            "training cannot use; use more GPUs per process, --dtype bfloat16, or a smaller backbone"
        )


def training_device(backbone: nn.Module) -> str:
    """Where the bridge trains and every loss term is computed: the device of the teacher's input embedding
    (the bridge's condition is that embedding's output)."""
    return str(input_device(backbone))
