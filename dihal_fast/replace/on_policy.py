"""On-policy distillation: train the bridge on the sequences the hybrid itself generates.

Teacher-forced distillation scores the hybrid on the corpus's prefixes only; when it generates, each token it draws
conditions the next, and a small per-token divergence compounds into samples that drift from the backbone's (the
real-model samples record). Distilling on its own continuations trains the states it visits (GKD, Agarwal et al.,
2024).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dihal_fast.hybrid.generation import float64_sampling


@torch.no_grad()
def own_continuations(hybrid, ids: Tensor, prefix: int, generator: torch.Generator) -> Tensor:
    """``ids[B, T]`` with every position after the first ``prefix`` replaced by the hybrid's own sample (temperature
    1, float64 draws from the CPU ``generator``, so a resumed step draws the same tokens)."""
    prompt = ids[:, :prefix]
    return hybrid.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=ids.shape[1] - prefix,
        eos_token_id=None,
        pad_token_id=0,
        **float64_sampling(1.0, None, 1.0, generator),
    )
