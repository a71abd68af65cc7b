"""One parser for the ``--device`` options: auto, cpu, cuda, cuda:N."""
from __future__ import annotations


def resolve_device(name: str):
    """``torch.device`` for ``name`` (``auto`` = the first CUDA device when torch sees one, else cpu).

    A CUDA device that torch cannot see, or any other device type, is a ValueError naming the fix.
    """
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r} is not a torch device (expected auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name} asked for, but torch sees no CUDA device here; use cpu")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name}: only cpu and cuda are supported, got {device.type}")
    return device
