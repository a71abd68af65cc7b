"""Exponential moving average of the trainable parameters (the weights that get exported)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dihal_fast.errors import DihalValueError


class EMA:
    """Float32 shadow copies, updated with decay ``min(decay, (1 + step) / (10 + step))`` (a warm-up)."""

    def __init__(self, named: list[tuple[str, nn.Parameter]], decay: float):
        self.decay = decay
        self.shadow: dict[str, Tensor] = {name: p.detach().float().clone() for name, p in named}

    @torch.no_grad()
    def update(self, named: list[tuple[str, nn.Parameter]], step: int) -> None:
        rate = min(self.decay, (1 + step) / (10 + step))
        for name, p in named:
            self.shadow[name].lerp_(p.detach().float().to(self.shadow[name].device), 1.0 - rate)

    def state_dict(self) -> dict[str, Tensor]:
        return {name: value.detach().cpu().contiguous() for name, value in self.shadow.items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if sorted(state) != sorted(self.shadow) or any(state[k].shape != v.shape for k, v in self.shadow.items()):
            raise DihalValueError("EMA state does not match this run's trainable parameters (names or shapes differ)")
        for name, value in state.items():
            self.shadow[name].copy_(value)
