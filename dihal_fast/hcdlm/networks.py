"""HC-DLM's three networks and the baselines (MDM, autoregressive), all over a task's token interface; which kind
builds which network is :mod:`dihal_fast.hcdlm.models`.

Shapes: ``context[B, C]`` (the task's given tokens), ``tokens[B, L]`` in ``[0, V]`` where ``V`` is the
[MASK] id, latents ``x[B, M, d]``, noise levels ``s[B]`` in ``[0, 1]``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dihal_fast.errors import DihalValueError
from dihal_fast.hcdlm.config import HCDLMModelConfig
from dihal_fast.hcdlm.layers import (
    Block,
    ContextEmbedding,
    SlotPositions,
    TimeEmbedding,
    position_table,
    run_blocks,
)
from dihal_fast.tasks.base import TaskSpec

LOGVAR_MAX = 0.0  # sigma <= 1: the noise never swamps the unit-scale mean
LOGVAR_INIT = -4.0  # start nearly deterministic so reconstruction can shape the latents first
READOUT_RANK = 16  # per-position features between the slots and the flattened latents


class TokenSlots(nn.Module):
    """Embeddings of the ``L`` target slots: token (optional, [MASK] included) + position + aligned context."""

    def __init__(self, spec: TaskSpec, hidden: int, with_tokens: bool = True) -> None:
        super().__init__()
        self.tokens = nn.Embedding(spec.target_vocab + 1, hidden) if with_tokens else None
        self.position = SlotPositions(spec, hidden)
        self.context = ContextEmbedding(spec, hidden)

    def forward(
        self, tokens: torch.Tensor | None, context: torch.Tensor, batch: int
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``(prefix context or None, slots[B, L, H])``."""
        prefix, slot_term = self.context(context)
        slots = self.position().expand(batch, -1, -1) + slot_term
        if self.tokens is not None:
            slots = slots + self.tokens(tokens)
        return prefix, slots


class SlotReadout(nn.Module):
    """``[B, L, H]`` slot states -> ``[B, out]``: each slot is squeezed to ``READOUT_RANK`` features and the
    flattened ``[L * READOUT_RANK]`` vector is mapped linearly, so every position writes to its own directions."""

    def __init__(self, length: int, hidden: int, out: int) -> None:
        super().__init__()
        self.squeeze = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, READOUT_RANK))
        self.linear = nn.Linear(length * READOUT_RANK, out)

    def forward(self, slots: torch.Tensor) -> torch.Tensor:
        return self.linear(self.squeeze(slots).flatten(1))


class CellProjection(nn.Module):
    """``[B, L, H]`` slot states -> ``[B, L, out]``, each slot on its own (the ``cells`` layout's read-out)."""

    def __init__(self, hidden: int, out: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.linear = nn.Linear(hidden, out)

    def forward(self, slots: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(slots))


def check_layout(spec: TaskSpec, cfg: HCDLMModelConfig) -> None:
    """The ``cells`` layout needs one latent per target slot."""
    if cfg.latent_layout == "cells" and cfg.latents != spec.target_len:
        raise DihalValueError(
            f"--latent-layout cells needs one latent per target slot: --latents {spec.target_len}, got {cfg.latents}"
        )


class Encoder(nn.Module):
    """q_psi(x_0 | k_0): a diagonal Gaussian over ``M`` latents.

    Read-out: every slot state is projected to ``k = READOUT_RANK`` features and the flattened
    ``[L * k]`` vector is mapped to the ``M`` latents, so each position writes to its own directions.
    (Pooling with learned queries starts out as a uniform average, which is the same for every Sudoku
    solution - each digit appears ``n`` times - and the reconstruction then stalls for hundreds of
    steps.) With ``latent_layout="cells"`` latent ``i`` is a projection of slot ``i``'s state alone. The mean is
    layer-normalised per latent (no affine), the scale of the flow's N(0, I) noise.
    The log-variance lies in ``[logvar_min, 0]``: by a scaled tanh (``logvar_bound="soft"``, slope 1 at
    the middle, a gradient everywhere; ours) or a hard clamp (``"clamp"``, the old behaviour: zero
    gradient outside, and sigma stuck at the floor once the reconstruction pushed it there).
    """

    def __init__(self, spec: TaskSpec, cfg: HCDLMModelConfig) -> None:
        super().__init__()
        self.latents, self.latent_dim = cfg.latents, cfg.latent_dim
        self.slots = TokenSlots(spec, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg.hidden, cfg.heads, cfg.dropout) for _ in range(cfg.encoder_blocks))
        self.out: nn.Module = (
            CellProjection(cfg.hidden, 2 * cfg.latent_dim)
            if cfg.latent_layout == "cells"
            else SlotReadout(spec.target_len, cfg.hidden, 2 * cfg.latents * cfg.latent_dim)
        )
        self.mean_norm = nn.LayerNorm(cfg.latent_dim, elementwise_affine=False)
        self.logvar_bound, self.logvar_min = cfg.logvar_bound, cfg.logvar_min
        logvar_bias = self.out.linear.bias.view(-1, 2, cfg.latent_dim)[:, 1]
        nn.init.constant_(logvar_bias, self.raw_logvar(LOGVAR_INIT))

    def raw_logvar(self, logvar: float) -> float:
        """The pre-activation that gives ``logvar`` (clipped into the open range), for the initial bias."""
        if self.logvar_bound == "clamp":
            return logvar
        middle, half = (self.logvar_min + LOGVAR_MAX) / 2, (LOGVAR_MAX - self.logvar_min) / 2
        return middle + half * math.atanh(max(-0.99, min(0.99, (logvar - middle) / half)))

    def bound_logvar(self, raw: torch.Tensor) -> torch.Tensor:
        """``raw`` mapped into ``[logvar_min, LOGVAR_MAX]``."""
        if self.logvar_bound == "clamp":
            return raw.clamp(self.logvar_min, LOGVAR_MAX)
        middle, half = (self.logvar_min + LOGVAR_MAX) / 2, (LOGVAR_MAX - self.logvar_min) / 2
        return middle + half * torch.tanh((raw - middle) / half)

    def forward(self, tokens: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean[B, M, d], logvar[B, M, d])``."""
        batch = tokens.shape[0]
        prefix, slots = self.slots(tokens, context, batch)
        h = run_blocks(self.blocks, [slots, prefix])[:, : slots.shape[1]]
        mean, logvar = self.out(h).view(batch, self.latents, 2, self.latent_dim).unbind(2)
        return self.mean_norm(mean), self.bound_logvar(logvar)


class Denoiser(nn.Module):
    """d_phi(x_t, k_t, s) ~ x_0: latents and scaffold tokens in one self-attention, adaLN on ``s``.

    With ``scaffold=False`` (the Latent DM baseline) the slots carry positions and context only.
    ``x_hat_0`` = the latent tokens' output + a ``SlotReadout`` of the slot states (the encoder's read-out
    shape; ``slot_readout=False``: the latent tokens' output only, the paper's): the slots do the per-cell
    work, as in a masked-diffusion network, and write it to the latent directly. Through the latent tokens
    alone, ``M`` queries must gather ``L`` cells by attention; with ``latent_layout="cells"`` latent token ``i``
    carries slot ``i``'s position and given (a second token per cell, the latent's).
    """

    def __init__(self, spec: TaskSpec, cfg: HCDLMModelConfig, scaffold: bool = True) -> None:
        super().__init__()
        self.scaffold = scaffold
        self.latent_in = nn.Linear(cfg.latent_dim, cfg.hidden)
        self.self_condition = nn.Linear(cfg.latent_dim, cfg.hidden, bias=False) if cfg.self_condition else None
        self.latent_position = position_table(cfg.latents, cfg.hidden) if cfg.latent_layout == "pooled" else None
        self.latent_cells = TokenSlots(spec, cfg.hidden, with_tokens=False) if cfg.latent_layout == "cells" else None
        self.slots = TokenSlots(spec, cfg.hidden, with_tokens=scaffold)
        self.time = TimeEmbedding(cfg.hidden)
        self.blocks = nn.ModuleList(
            Block(cfg.hidden, cfg.heads, cfg.dropout, cond_dim=cfg.hidden) for _ in range(cfg.denoiser_blocks)
        )
        self.out_norm = nn.LayerNorm(cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.latent_dim)
        self.readout = (
            SlotReadout(spec.target_len, cfg.hidden, cfg.latents * cfg.latent_dim) if cfg.slot_readout else None
        )
        # Training-only per-slot token head (deep supervision, ours; see ObjectiveConfig.slot_aux_weight).
        self.slot_head = (
            nn.Sequential(nn.LayerNorm(cfg.hidden), nn.Linear(cfg.hidden, spec.target_vocab)) if cfg.slot_head else None
        )

    def forward(
        self,
        x_t: torch.Tensor,
        scaffold: torch.Tensor | None,
        s: torch.Tensor,
        context: torch.Tensor,
        slot_logits: bool = False,
        x_prev: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``x_hat_0[B, M, d]``; with ``slot_logits`` also the slot head's ``[B, L, V]`` logits (None without one).
        ``x_prev``: the previous estimate of ``x_0`` a self-conditioned denoiser reads (None: zeros, no estimate
        yet); ignored without ``self_condition``."""
        batch, m = x_t.shape[0], x_t.shape[1]
        prefix, slots = self.slots(scaffold if self.scaffold else None, context, batch)
        if self.latent_cells is not None:
            latents = self.latent_in(x_t) + self.latent_cells(None, context, batch)[1]
        else:
            latents = self.latent_in(x_t) + self.latent_position
        if self.self_condition is not None and x_prev is not None:
            latents = latents + self.self_condition(x_prev)
        h = run_blocks(self.blocks, [latents, slots, prefix], self.time(s))
        slot_states = h[:, m : m + slots.shape[1]]
        x_hat = self.out(self.out_norm(h[:, :m]))
        if self.readout is not None:
            x_hat = x_hat + self.readout(slot_states).view(batch, m, -1)
        if not slot_logits:
            return x_hat
        return x_hat, (self.slot_head(slot_states) if self.slot_head is not None else None)


class Predictor(nn.Module):
    """p_theta(k_0 | x_0): ``L`` position queries attend to the latents (and the context) -> logits.

    The flattened latents are also mapped to ``k = READOUT_RANK`` features per position and added to
    each slot (mirror of the encoder's read-out): a direct, position-specific path from ``x_0`` to every
    slot. Through attention alone one latent among ``L`` slots is ignored for hundreds of steps and the
    reconstruction stalls at copying the context. With ``latent_layout="cells"`` slot ``i`` reads latent ``i``
    (a linear map added to it) and the slots attend among themselves: no latent tokens.
    """

    def __init__(self, spec: TaskSpec, cfg: HCDLMModelConfig) -> None:
        super().__init__()
        self.target_len = spec.target_len
        self.cells = cfg.latent_layout == "cells"
        if self.cells:
            self.cell_in = nn.Linear(cfg.latent_dim, cfg.hidden)
        else:
            self.expand = nn.Linear(cfg.latents * cfg.latent_dim, spec.target_len * READOUT_RANK)
            self.lift = nn.Linear(READOUT_RANK, cfg.hidden)
            self.latent_in = nn.Linear(cfg.latent_dim, cfg.hidden)
            self.latent_position = position_table(cfg.latents, cfg.hidden)
        self.slots = TokenSlots(spec, cfg.hidden, with_tokens=False)
        self.blocks = nn.ModuleList(Block(cfg.hidden, cfg.heads, cfg.dropout) for _ in range(cfg.predictor_blocks))
        self.head = nn.Sequential(nn.LayerNorm(cfg.hidden), nn.Linear(cfg.hidden, spec.target_vocab))

    def forward(self, x_0: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """``logits[B, L, V]``."""
        batch, m = x_0.shape[0], x_0.shape[1]
        prefix, slots = self.slots(None, context, batch)
        if self.cells:
            return self.head(run_blocks(self.blocks, [slots + self.cell_in(x_0), prefix])[:, : slots.shape[1]])
        slots = slots + self.lift(self.expand(x_0.flatten(1)).view(batch, self.target_len, READOUT_RANK))
        h = run_blocks(self.blocks, [self.latent_in(x_0) + self.latent_position, slots, prefix])
        return self.head(h[:, m : m + slots.shape[1]])


class HCDLM(nn.Module):
    """Encoder, denoiser and token predictor; ``scaffold=False`` gives the Latent DM baseline."""

    def __init__(self, spec: TaskSpec, cfg: HCDLMModelConfig, scaffold: bool = True) -> None:
        super().__init__()
        check_layout(spec, cfg)
        self.spec, self.cfg, self.scaffold = spec, cfg, scaffold
        self.encoder = Encoder(spec, cfg)
        self.denoiser = Denoiser(spec, cfg, scaffold)
        self.predictor = Predictor(spec, cfg)

    @property
    def mask_id(self) -> int:
        return self.spec.target_vocab

    @property
    def kind(self) -> str:
        """Its entry in :data:`dihal_fast.hcdlm.models.KINDS`."""
        return "hcdlm" if self.scaffold else "latent"


class MDMNet(nn.Module):
    """Bidirectional transformer predicting clean tokens at every slot from a partly [MASK]ed sequence."""

    kind = "mdm"

    def __init__(self, spec: TaskSpec, cfg: HCDLMModelConfig, blocks: int) -> None:
        super().__init__()
        self.spec = spec
        self.slots = TokenSlots(spec, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg.hidden, cfg.heads, cfg.dropout) for _ in range(blocks))
        self.head = nn.Sequential(nn.LayerNorm(cfg.hidden), nn.Linear(cfg.hidden, spec.target_vocab))

    @property
    def mask_id(self) -> int:
        return self.spec.target_vocab

    def forward(self, tokens: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """``logits[B, L, V]`` of the clean tokens."""
        prefix, slots = self.slots(tokens, context, tokens.shape[0])
        return self.head(run_blocks(self.blocks, [slots, prefix])[:, : slots.shape[1]])


class ARNet(nn.Module):
    """Causal transformer over ``[context, BOS, target]``, predicting each target token from the left."""

    kind = "ar"

    def __init__(self, spec: TaskSpec, cfg: HCDLMModelConfig, blocks: int) -> None:
        super().__init__()
        self.spec = spec
        self.context_embed = nn.Embedding(max(spec.context_vocab, 1), cfg.hidden)
        self.token_embed = nn.Embedding(spec.target_vocab + 1, cfg.hidden)  # last id = BOS
        self.context_position = position_table(spec.context_len, cfg.hidden)
        self.slot_position = SlotPositions(spec, cfg.hidden)  # BOS sits in slot 0; slot i predicts target i
        self.blocks = nn.ModuleList(Block(cfg.hidden, cfg.heads, cfg.dropout, causal=True) for _ in range(blocks))
        self.head = nn.Sequential(nn.LayerNorm(cfg.hidden), nn.Linear(cfg.hidden, spec.target_vocab))

    @property
    def bos_id(self) -> int:
        return self.spec.target_vocab

    def forward(
        self, context: torch.Tensor, prefix_tokens: torch.Tensor, caches: list[list[torch.Tensor]] | None = None
    ) -> torch.Tensor:
        """Logits ``[B, T, V]`` for target positions ``0..T-1`` given ``prefix_tokens[B, T]`` (BOS first).

        ``caches`` (decoding, one list per block): empty on the first call, which sees the whole prefix; each later
        call reads only the prefix's last token, attends to the keys and values kept before and returns its logits
        alone (``[B, 1, V]``), the same as the full pass's last row without recomputing the prefix."""
        slots = self.slot_position()
        first = 0 if caches is None or not caches[0] else prefix_tokens.shape[1] - 1
        h = self.token_embed(prefix_tokens[:, first:]) + slots[first : prefix_tokens.shape[1]]
        if first == 0:
            context_h = self.context_embed(context) + self.context_position
            if self.spec.aligned:
                context_h = context_h + slots
            h = torch.cat([context_h, h], dim=1)
        for block, cache in zip(self.blocks, caches or [None] * len(self.blocks), strict=True):
            h = block(h, cache=cache)
        return self.head(h[:, context.shape[1] :] if first == 0 else h)
