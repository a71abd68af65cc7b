"""Transformer building blocks shared by HC-DLM and the baselines."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dihal_fast.tasks.base import TaskSpec


class Block(nn.Module):
    """Pre-norm self-attention + MLP block; with ``cond_dim`` an adaLN-Zero (DiT) block on a vector."""

    def __init__(self, hidden: int, heads: int, dropout: float = 0.0, cond_dim: int = 0, causal: bool = False) -> None:
        super().__init__()
        self.hidden, self.heads, self.causal, self.dropout = hidden, heads, causal, dropout
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=not cond_dim)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=not cond_dim)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))
        self.drop = nn.Dropout(dropout)
        self.modulation = None
        if cond_dim:
            self.modulation = nn.Linear(cond_dim, 6 * hidden)
            nn.init.zeros_(self.modulation.weight)
            nn.init.zeros_(self.modulation.bias)

    def _attend(self, h: torch.Tensor, cache: list[torch.Tensor] | None) -> torch.Tensor:
        b, n, d = h.shape
        q, k, v = self.qkv(h).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if cache is not None:  # causal decoding: one new position attends to every earlier one, kept from before
            if not self.causal or (cache and n != 1):
                raise ValueError(f"a cached block takes one new position at a time on a causal block, got {n}")
            if cache:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[:] = [k, v]
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=self.causal and n > 1, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(out.transpose(1, 2).reshape(b, n, d))

    def forward(
        self, h: torch.Tensor, cond: torch.Tensor | None = None, cache: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        """``h[B, N, H]`` (and ``cond[B, C]`` for adaptive blocks) -> ``[B, N, H]``. ``cache`` (causal blocks): an
        empty list is filled with the keys and values of ``h``; a filled one takes ``h`` as the next position."""
        if self.modulation is None:
            h = h + self.drop(self._attend(self.norm1(h), cache))
            return h + self.drop(self.mlp(self.norm2(h)))
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(cond)[:, None].chunk(6, dim=-1)
        h = h + gate1 * self.drop(self._attend(self.norm1(h) * (1 + scale1) + shift1, cache))
        return h + gate2 * self.drop(self.mlp(self.norm2(h) * (1 + scale2) + shift2))


class TimeEmbedding(nn.Module):
    """Sinusoidal features of the noise level ``s in [0, 1]`` followed by an MLP: ``[B] -> [B, H]``."""

    def __init__(self, hidden: int, features: int = 64) -> None:
        super().__init__()
        self.features = features
        self.mlp = nn.Sequential(nn.Linear(features, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        half = self.features // 2
        freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, device=s.device, dtype=torch.float32) / half)
        angles = 1000.0 * s.float()[:, None] * freqs[None]
        return self.mlp(torch.cat([angles.sin(), angles.cos()], dim=-1))


def position_table(length: int, hidden: int) -> nn.Parameter:
    """Learned position vectors, N(0, 1) like the ``nn.Embedding`` token tables they are summed with.

    At the usual 0.02 they vanish under the tokens' scale after the first LayerNorm: 6x6 Sudoku stayed at
    chance for 4,000 steps and Countdown's masked CE was 1.25 vs 0.90 at N(0, 1) after 575 steps (measured).
    """
    return nn.Parameter(torch.randn(length, hidden))


class SlotPositions(nn.Module):
    """Position features of the ``L`` target slots: a free vector per slot plus one embedding per
    structural label (``spec.slot_groups``). ``forward() -> [L, H]``."""

    def __init__(self, spec: TaskSpec, hidden: int) -> None:
        super().__init__()
        self.free = position_table(spec.target_len, hidden)
        self.groups = nn.ModuleList(nn.Embedding(max(labels) + 1, hidden) for labels in spec.slot_groups)
        labels = torch.tensor(spec.slot_groups, dtype=torch.long).reshape(len(spec.slot_groups), spec.target_len)
        self.register_buffer("labels", labels, persistent=False)  # [G, L]

    def forward(self) -> torch.Tensor:
        out = self.free
        for embed, labels in zip(self.groups, self.labels):
            out = out + embed(labels)
        return out


class ContextEmbedding(nn.Module):
    """The task's given context, as each module receives it.

    Aligned contexts (Sudoku) are added to the ``target_len`` slots; others become prefix tokens with
    their own positions. ``forward(context[B, C]) -> (prefix[B, C', H], slot_term[B, L, H] or 0)``.
    """

    def __init__(self, spec: TaskSpec, hidden: int) -> None:
        super().__init__()
        self.aligned = spec.aligned
        self.embed = nn.Embedding(spec.context_vocab, hidden) if spec.context_len else None
        self.position = position_table(spec.context_len, hidden) if spec.context_len and not spec.aligned else None

    def forward(self, context: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | float]:
        if self.embed is None:
            return None, 0.0
        embedded = self.embed(context)
        if self.aligned:
            return None, embedded
        return embedded + self.position, 0.0


def run_blocks(
    blocks: nn.ModuleList, parts: list[torch.Tensor | None], cond: torch.Tensor | None = None
) -> torch.Tensor:
    """Concatenate the non-empty ``parts`` along the sequence, run ``blocks``, return the full sequence."""
    h = torch.cat([p for p in parts if p is not None], dim=1)
    for block in blocks:
        h = block(h, cond)
    return h


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
