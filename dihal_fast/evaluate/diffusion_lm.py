"""A small Diffusion-LM-like control: continuous diffusion in the backbone's token-embedding space
with rounding to the nearest token (Li et al. 2022, reduced to what a same-budget control needs).

x0 is the backbone's (frozen) input embedding of each token, standardised per dimension. A
bidirectional transformer predicts x0 from z_t = alpha(t) x0 + sigma(t) eps under the bridge's cosine
VP schedule (:mod:`dihal_fast.bridge.schedules`); the loss is the x0 regression plus Diffusion-LM's
rounding cross-entropy (logits = negative squared distance to every token embedding). Sampling is
unconditional: the bridge's deterministic DDIM sampler from Gaussian noise, with Diffusion-LM's
clamping of x0_hat to the nearest embedding at every step and a final rounding to the nearest token.
It has no tractable likelihood, so its NLL/PPL/KL are not reported.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dihal_fast.bridge.samplers import DDIM
from dihal_fast.bridge.schedules import CosineSchedule, Prediction
from dihal_fast.common import atomic_write_bytes, atomic_write_json, read_json
from dihal_fast.common.progress import progress_bar
from dihal_fast.cpu_threads import poll_threads
from dihal_fast.evaluate.generation import Generation

logger = logging.getLogger(__name__)

SCHEDULE = CosineSchedule()


@dataclass
class DiffusionLMConfig:
    """Size and training of the control (saved next to its checkpoint)."""

    seq_len: int = 64
    width: int = 128
    layers: int = 2
    heads: int = 4
    lr: float = 1e-3
    batch_size: int = 16
    steps: int = 200
    nfe: int = 50
    seed: int = 0


class DiffusionLM(nn.Module):
    """Bidirectional x0-predicting denoiser over standardised token embeddings ``[V, D]``."""

    def __init__(self, embedding: torch.Tensor, config: DiffusionLMConfig):
        super().__init__()
        self.config = config
        emb = embedding.detach().float()
        self.register_buffer("mean", emb.mean(dim=0))
        self.register_buffer("std", emb.std(dim=0).clamp_min(1e-6))
        self.register_buffer("table", (emb - self.mean) / self.std)
        dim, width = emb.shape[1], config.width
        self.inp = nn.Linear(dim, width)
        self.pos = nn.Embedding(config.seq_len, width)
        self.time = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        layer = nn.TransformerEncoderLayer(
            width, config.heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, config.layers, enable_nested_tensor=False)
        self.out = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, dim))

    def _time_features(self, t: torch.Tensor) -> torch.Tensor:
        half = self.config.width // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device) / half)
        angles = 1000.0 * t[:, None] * freqs[None]
        return self.time(torch.cat([angles.sin(), angles.cos()], dim=-1))

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``x0_hat[B, T, D]`` from ``x_t[B, T, D]`` and ``t[B]`` in [0, 1]."""
        positions = torch.arange(x_t.shape[1], device=x_t.device)
        h = self.inp(x_t) + self.pos(positions)[None] + self._time_features(t)[:, None]
        return self.out(self.encoder(h))

    def round_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Rounding logits ``-||x - e_v||^2`` over the vocabulary, ``[B, T, V]``."""
        return 2 * x @ self.table.T - self.table.pow(2).sum(-1) - x.pow(2).sum(-1, keepdim=True)

    def loss(self, tokens: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """x0 regression (mean over dims) + rounding cross-entropy on a batch ``tokens[B, T]``."""
        x0 = self.table[tokens]
        t = torch.rand(tokens.shape[0], generator=generator)
        alpha, sigma = SCHEDULE.alpha_sigma(t[:, None, None])
        noise = torch.randn(x0.shape, generator=generator)
        x0_hat = self(alpha * x0 + sigma * noise, t)
        rounding = F.cross_entropy(self.round_logits(x0_hat).transpose(1, 2), tokens)
        return F.mse_loss(x0_hat, x0) + rounding

    def clamped_x0(self, z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x0 prediction snapped to the nearest token embedding (Diffusion-LM's clamping trick)."""
        x0_hat = self(z, t.expand(z.shape[0]))
        return self.table[self.round_logits(x0_hat).argmax(-1)]

    @torch.no_grad()
    def sample(self, n_samples: int, length: int, nfe: int, generator: torch.Generator | None = None) -> Generation:
        """``n_samples`` unconditional sequences of ``length`` tokens: DDIM (eta = 0), clamping, rounding."""
        if not 1 <= length <= self.config.seq_len:
            raise ValueError(
                f"length must lie in 1..{self.config.seq_len} (the control's sequence length), got {length}"
            )
        start = time.perf_counter()
        z = torch.randn((n_samples, length, self.table.shape[1]), generator=generator)
        x0 = DDIM().sample(self.clamped_x0, SCHEDULE, Prediction("x0"), z, nfe)
        tokens = self.round_logits(x0).argmax(-1)
        return Generation(tokens, time.perf_counter() - start)


def train_diffusion_lm(
    embedding: torch.Tensor, blocks: torch.Tensor, config: DiffusionLMConfig, out_dir: str | Path
) -> DiffusionLM:
    """Train the control on ``blocks[N, seq_len]`` for ``config.steps`` and save it to ``out_dir``.

    A finished checkpoint in ``out_dir`` with the same config is loaded instead of retrained.
    """
    from safetensors.torch import load_file, save

    out_dir = Path(out_dir)
    if blocks.dim() != 2 or blocks.shape[1] != config.seq_len:
        raise ValueError(f"blocks must be [N, {config.seq_len}], got {tuple(blocks.shape)}")
    model = DiffusionLM(embedding, config)
    finished = (out_dir / "model.safetensors").is_file() and (out_dir / "config.json").is_file()
    if finished and read_json(out_dir / "config.json") == asdict(config):
        logger.info("loading the finished Diffusion-LM control from %s", out_dir)
        model.load_state_dict(load_file(out_dir / "model.safetensors"))
        return model.eval()
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    trainable = list(model.parameters())
    optimizer = torch.optim.AdamW(trainable, lr=config.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20))
    losses = []
    model.train()
    for _ in progress_bar(range(config.steps), desc="Diffusion-LM control", leave=False):
        poll_threads()
        index = torch.randint(0, blocks.shape[0], (config.batch_size,), generator=generator)
        loss = model.loss(blocks[index], generator)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / "train_log.json", {"loss": losses})
    atomic_write_bytes(out_dir / "model.safetensors", save(model.state_dict()))
    atomic_write_json(out_dir / "config.json", asdict(config))  # written last: marks the checkpoint finished
    return model
