"""Reproducible seeds for Python, NumPy and torch."""

from __future__ import annotations

import numbers
import random

import numpy as np

from dihal_fast.errors import DihalTypeError, DihalValueError


def seed_everything(seed: int) -> None:
    """Seed ``random``, NumPy's legacy global generator and torch (CPU and CUDA). ``seed`` is an integer in
    ``0 .. 2^63 - 1``: a bool, a float (``1.5`` would mean seed 1) or a string (``'3'``) is refused."""
    import torch

    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise DihalTypeError(f"seed must be an integer, got {seed!r}")
    if not 0 <= seed <= 2**63 - 1:
        raise DihalValueError(f"seed must be in 0 .. 2**63 - 1, got {seed}")
    seed = int(seed)

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
