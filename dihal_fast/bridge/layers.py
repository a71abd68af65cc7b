"""Building blocks of the bridge: rotary causal self-attention with a KV cache, FiLM residual MLPs and
the sinusoidal time embedding."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dihal_fast.errors import DihalValueError

KVCache = tuple[Tensor, Tensor]


def sinusoidal_embedding(t: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
    """``(*t.shape, dim)`` sin/cos features of ``1000 t`` (``t`` in [0, 1]) at geometric frequencies."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    angles = 1000.0 * t.float().unsqueeze(-1) * freqs
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


Rotary = tuple[Tensor, Tensor]
Modulation = tuple[Tensor, Tensor, Tensor]


def rotary_tables(positions: Tensor, head_dim: int, dtype: torch.dtype, theta: float = 10000.0) -> Rotary:
    """``(cos, sin)`` ``(B, 1, T, head_dim)`` in ``dtype`` of the rotary embedding at integer ``positions`` ``(B, T)``.

    Computed (in float32) once per call of the context encoder and shared by its blocks.
    """
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.float().unsqueeze(-1) * inv_freq  # (B, T, head_dim / 2)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([cos, cos], dim=-1).unsqueeze(1).to(dtype), torch.cat([sin, sin], dim=-1).unsqueeze(1).to(dtype)


def _rotate(x: Tensor, rotary: Rotary) -> Tensor:
    """Rotary position embedding of ``x`` ``(..., B, heads, T, head_dim)`` (queries and keys stacked in one call)."""
    first, second = x.chunk(2, dim=-1)
    return x * rotary[0] + torch.cat([-second, first], dim=-1) * rotary[1]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with rotary positions; ``cache`` makes a new token cost one position."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        if width % heads or (width // heads) % 2:
            raise DihalValueError(f"width {width} must split into {heads} heads of even size")
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(
        self, x: Tensor, rotary: Rotary, key_mask: Tensor | None = None, cache: KVCache | None = None
    ) -> tuple[Tensor, KVCache]:
        """``x`` ``(B, T, W)`` with the rotary tables of its positions; ``key_mask`` ``(B, past + T)`` is False
        at padding.

        Query ``i`` of this call sees keys ``0 .. past + i`` (sequence order, not position ids) that are
        not padding, and always itself. Returns the output and the extended ``(keys, values)``.
        """
        batch, length, width = x.shape
        qkv = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        (q, k), v = _rotate(qkv[:2], rotary), qkv[2]
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        past = k.shape[2] - length
        if key_mask is None and past == 0:
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif key_mask is None and length == 1:  # one new token sees every key: no mask to build
            attended = F.scaled_dot_product_attention(q, k, v)
        else:
            keys = torch.arange(past + length, device=x.device)
            queries = torch.arange(past, past + length, device=x.device)
            allowed = keys[None, :] <= queries[:, None]  # (T, past + T)
            if key_mask is not None:
                allowed = (allowed & key_mask[:, None, :].bool()) | (keys[None, :] == queries[:, None])
                allowed = allowed.unsqueeze(1)  # (B, 1, T, past + T)
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.out(attended.transpose(1, 2).reshape(batch, length, width)), (k, v)


class ContextBlock(nn.Module):
    """Pre-norm transformer block (causal attention + MLP) of the context encoder."""

    def __init__(self, width: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width))

    def forward(
        self, x: Tensor, rotary: Rotary, key_mask: Tensor | None, cache: KVCache | None
    ) -> tuple[Tensor, KVCache]:
        attended, cache = self.attention(self.norm1(x), rotary, key_mask, cache)
        x = x + attended
        return x + self.mlp(self.norm2(x)), cache


class FiLMBlock(nn.Module):
    """Residual MLP whose normalised input is scaled, shifted and gated by the time embedding (FiLM)."""

    def __init__(self, width: int, time_dim: int, mlp_ratio: int):
        super().__init__()
        self.norm = nn.LayerNorm(width, elementwise_affine=False)
        self.film = nn.Linear(time_dim, 3 * width)
        self.fc1, self.fc2 = nn.Linear(width, mlp_ratio * width), nn.Linear(mlp_ratio * width, width)
        nn.init.zeros_(self.film.weight)
        nn.init.zeros_(self.film.bias)

    def modulation(self, time_features: Tensor) -> Modulation:
        """``(shift, 1 + scale, 1 + gate)``: a function of the time alone, so a sampler can reuse it."""
        shift, scale, gate = self.film(time_features).chunk(3, dim=-1)
        return shift, 1.0 + scale, 1.0 + gate

    def forward(self, x: Tensor, modulation: Modulation) -> Tensor:
        shift, scale, gate = modulation
        hidden = self.norm(x) * scale + shift
        return x + gate * self.fc2(F.gelu(self.fc1(hidden)))
