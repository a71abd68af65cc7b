"""The teacher's statistics of ``h_l`` that normalise the bridge's targets (see dihal_fast.bridge.model)."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from dihal_fast.hybrid import backbone_targets


@torch.no_grad()
def target_statistics(backbone: nn.Module, blocks: Tensor, layer: int, batch_size: int) -> tuple[Tensor, float]:
    """Per-dimension mean (float64 ``(D,)``) and ``sqrt(mean per-dimension variance)`` of ``h_layer`` on ``blocks``."""
    if blocks.shape[0] == 0:
        raise ValueError("no blocks to compute target statistics on")
    device = next(backbone.parameters()).device
    total = second = None
    count = 0
    for start in range(0, blocks.shape[0], batch_size):
        hidden, _ = backbone_targets(backbone, blocks[start:start + batch_size].to(device), layer)
        flat = hidden.reshape(-1, hidden.shape[-1]).double().cpu()
        total = flat.sum(0) if total is None else total + flat.sum(0)
        second = flat.pow(2).sum(0) if second is None else second + flat.pow(2).sum(0)
        count += flat.shape[0]
    mean = total / count
    variance = (second / count - mean.pow(2)).clamp(min=0.0)
    std = float(variance.mean().sqrt())
    if not std > 0:
        raise ValueError(f"hidden state {layer} is constant on the statistics blocks; cannot normalise it")
    return mean, std
