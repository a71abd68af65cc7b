"""The teacher's statistics of ``h_l`` that normalise the bridge's targets (see dihal_fast.bridge.model)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from dihal_fast.common.progress import progress_bar
from dihal_fast.errors import DihalValueError
from dihal_fast.hybrid import hidden_state
from dihal_fast.hybrid.slicing import embedding_output, position_table

# ``(input_ids, layer) -> (h_layer, logits)`` as :func:`~dihal_fast.hybrid.backbone_targets` gives them (one forward
# pass of the backbone); the sweep passes one that shares each batch's pass among its layers.
Teacher = Callable[[Tensor, int], tuple[Tensor, Tensor]]


@torch.no_grad()
def target_statistics(
    backbone: nn.Module, blocks: Tensor, layer: int, batch_size: int, teacher: Teacher | None = None
) -> tuple[Tensor, Tensor, float]:
    """Per-dimension mean and variance (float64 ``(D,)`` each) of ``h_layer`` on ``blocks``, and the root mean
    square of the condition ``c(x)`` on the same tokens (``teacher``: where the targets come from, default the
    backbone's layers up to ``layer`` alone)."""
    if blocks.shape[0] == 0:
        raise DihalValueError("no blocks to compute target statistics on")
    device = backbone.get_input_embeddings().weight.device
    table = position_table(backbone)
    total = second = None
    condition_square, count = 0.0, 0
    starts = range(0, blocks.shape[0], batch_size)
    for start in progress_bar(starts, desc=f"target statistics, layer {layer}", unit="batch", leave=False):
        ids = blocks[start : start + batch_size].to(device)
        hidden = teacher(ids, layer)[0] if teacher is not None else hidden_state(backbone, ids, layer)
        flat = hidden.reshape(-1, hidden.shape[-1]).double().cpu()
        total = flat.sum(0) if total is None else total + flat.sum(0)
        second = flat.pow(2).sum(0) if second is None else second + flat.pow(2).sum(0)
        positions = torch.arange(ids.shape[1], device=device).expand_as(ids)
        condition_square += float(embedding_output(backbone, ids, positions, table).double().pow(2).sum())
        count += flat.shape[0]
    mean = total / count
    variance = (second / count - mean.pow(2)).clamp(min=0.0)
    condition_rms = (condition_square / (count * hidden.shape[-1])) ** 0.5
    if not float(variance.mean()) > 0 or not condition_rms > 0:
        raise DihalValueError(
            f"hidden state {layer} or the embedding output is constant on the statistics blocks; cannot normalise"
        )
    return mean, variance, condition_rms


def target_scales(variance: Tensor, scaling: str) -> tuple[float, Tensor | None]:
    """The scalar std ``sqrt(mean variance)`` and the per-dimension divisors of ``z`` that ``scaling`` gives:
    ``scalar`` none (every dimension divided by the scalar); ``clipped`` ``max(std_d, median std)`` (the median
    dimension's: the lower middle one of an even count), so each dimension wider than the median one is brought to
    unit variance (a massive-activation dimension holds no more of the loss than any other) and the narrower ones
    keep their relative scales; refused when the median dimension is constant (nothing to clip at)."""
    std = float(variance.mean().sqrt())
    if scaling == "scalar":
        return std, None
    if scaling != "clipped":
        raise DihalValueError(f"unknown target scaling {scaling!r}; expected 'scalar' or 'clipped'")
    dim_std = variance.sqrt()
    median = float(dim_std.median())
    if not median > 0:
        raise DihalValueError("clipped target scaling: the median dimension of the hidden state is constant")
    return std, dim_std.clamp(min=median)
