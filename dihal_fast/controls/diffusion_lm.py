"""A small Diffusion-LM-like control: continuous diffusion in the backbone's token-embedding space
with rounding to the nearest token (Li et al. 2022, reduced to what a same-budget control needs).

x0 is the backbone's (frozen) input embedding of each token, standardised per dimension. A
bidirectional transformer predicts x0 from z_t = alpha(t) x0 + sigma(t) eps under the bridge's cosine
VP schedule (:mod:`dihal_fast.bridge.schedules`); the loss is the x0 regression plus Diffusion-LM's
rounding cross-entropy (logits = negative squared distance to every token embedding). Sampling is
unconditional: the bridge's deterministic DDIM sampler from Gaussian noise, with Diffusion-LM's
clamping of x0_hat to the nearest embedding at every step and a final rounding to the nearest token.
It has no tractable likelihood, so its NLL/PPL/KL are not reported.

It is trained as the bridge it is compared with: :func:`dihal_fast.train.fit` with AdamW, the same
warm-up + cosine schedule, clipping and EMA (the exported weights are the EMA's), checkpoints and resume.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dihal_fast.bridge.samplers import DDIM
from dihal_fast.bridge.schedules import CosineSchedule, Prediction
from dihal_fast.common import atomic_write_bytes, atomic_write_json, read_json
from dihal_fast.common.options import option
from dihal_fast.common.validation import CheckedConfig
from dihal_fast.errors import DihalValueError
from dihal_fast.train.engines import Engine
from dihal_fast.train.settings import LoopSettings, loop_option
from dihal_fast.train.trainer import TrainingJob, fit, resume_point

logger = logging.getLogger(__name__)

SCHEDULE = CosineSchedule()
CONFIG_NAME = "diffusion_lm_config.json"  # in each checkpoint; config.json beside the weights marks a finished run


@dataclass
class DiffusionLMConfig(CheckedConfig):
    """Size and training of the control (saved next to its checkpoint). The loop fields default to the
    bridge's (:class:`dihal_fast.replace.BridgeTrainConfig`) except the rate and the batch."""

    seq_len: int = option(64, "tokens per training sequence (and the longest sample)", min=1)
    width: int = option(128, "transformer width", min=2)
    layers: int = option(2, "bidirectional transformer blocks", min=1)
    heads: int = option(4, "attention heads (divide the width)", min=1)
    lr: float = loop_option("lr", 1e-3, "then a cosine to a tenth of it")
    batch_size: int = loop_option("batch_size", 16, "an example is one sequence")
    steps: int = loop_option("steps", 200)
    warmup_steps: int = loop_option("warmup_steps", 20)
    grad_clip: float = loop_option("grad_clip", 1.0)
    ema_decay: float = loop_option("ema_decay", 0.999)
    nfe: int = option(50, "denoiser evaluations per sample (DDIM steps)", min=1)
    seed: int = loop_option("seed", 0)
    checkpoint_every: int = loop_option("checkpoint_every", 100)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.width % 2 or self.width % self.heads:
            raise DihalValueError(f"--width must be even and a multiple of --heads, got {self.width} and {self.heads}")

    def loop_settings(self, device: str = "cpu") -> LoopSettings:
        """The shared loop's view of the control's training."""
        return LoopSettings.from_config(self, device=device, log_every=max(1, self.steps // 20))


class DiffusionLM(nn.Module):
    """Bidirectional x0-predicting denoiser over standardised token embeddings ``[V, D]``."""

    def __init__(self, embedding: torch.Tensor, config: DiffusionLMConfig):
        super().__init__()
        self.config = config
        emb = embedding.detach().float().cpu()
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
        """x0 regression (mean over dims) + rounding cross-entropy on a batch ``tokens[B, T]``; the noise is
        drawn on the CPU from ``generator`` (the same draws on every device)."""
        x0 = self.table[tokens]
        t = torch.rand(tokens.shape[0], generator=generator).to(x0.device)
        alpha, sigma = SCHEDULE.alpha_sigma(t[:, None, None])
        noise = torch.randn(x0.shape, generator=generator).to(x0.device)
        x0_hat = self(alpha * x0 + sigma * noise, t)
        rounding = F.cross_entropy(self.round_logits(x0_hat).transpose(1, 2), tokens)
        return F.mse_loss(x0_hat, x0) + rounding

    def clamped_x0(self, z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x0 prediction snapped to the nearest token embedding (Diffusion-LM's clamping trick)."""
        x0_hat = self(z, t.expand(z.shape[0]))
        return self.table[self.round_logits(x0_hat).argmax(-1)]

    @torch.no_grad()
    def sample(self, n_samples: int, length: int, nfe: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``tokens[n_samples, length]``: unconditional DDIM (eta = 0) with clamping, then rounding."""
        if not 1 <= length <= self.config.seq_len:
            raise DihalValueError(
                f"length must lie in 1..{self.config.seq_len} (the control's sequence length), got {length}"
            )
        z = torch.randn((n_samples, length, self.table.shape[1]), generator=generator).to(self.table.device)
        x0 = DDIM().sample(self.clamped_x0, SCHEDULE, Prediction("x0"), z, nfe)
        return self.round_logits(x0).argmax(-1)


class _Objective(nn.Module):
    """``{"loss": ...}`` of one batch, as :func:`fit` expects."""

    def __init__(self, model: DiffusionLM):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, generator: torch.Generator) -> dict:
        return {"loss": self.model.loss(tokens, generator)}


class DiffusionLMJob(TrainingJob):
    """Random training sequences and diffusion noise drawn from a generator seeded by ``(seed, step)``:
    every step's batch is a function of the step alone, so a resumed run repeats the same steps."""

    name = "diffusion_lm"
    resumable = frozenset({"steps"})  # a longer budget continues the last checkpoint (the schedule re-planned)

    def __init__(self, model: DiffusionLM, blocks: torch.Tensor, config: DiffusionLMConfig, device: str):
        self.model, self.blocks, self.config = model, blocks, config
        self.objective = _Objective(model)
        self.settings = config.loop_settings(device)
        self.configs = {CONFIG_NAME: asdict(config)}

    def batch(self, step: int, engine: Engine) -> dict:
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + step)
        index = torch.randint(0, self.blocks.shape[0], (self.config.batch_size,), generator=generator)
        return {"tokens": self.blocks[index].to(engine.device), "generator": generator}


def train_diffusion_lm(
    embedding: torch.Tensor,
    blocks: torch.Tensor,
    config: DiffusionLMConfig,
    out_dir: str | Path,
    device: str = "cpu",
    progress: bool = True,
) -> DiffusionLM:
    """Train the control on ``blocks[N, seq_len]`` in ``out_dir`` and export its EMA weights there.

    A finished export in ``out_dir`` with the same config is loaded instead of retrained; an interrupted
    run continues from its last checkpoint (the same config, or a one-line refusal).
    """
    from safetensors.torch import load_file, save

    out_dir = Path(out_dir)
    if blocks.dim() != 2 or blocks.shape[1] != config.seq_len:
        raise DihalValueError(f"blocks must be [N, {config.seq_len}], got {tuple(blocks.shape)}")
    torch.manual_seed(config.seed)
    model = DiffusionLM(embedding, config)
    finished = (out_dir / "model.safetensors").is_file() and (out_dir / "config.json").is_file()
    if finished and read_json(out_dir / "config.json") == asdict(config):
        logger.info("loading the finished Diffusion-LM control from %s", out_dir)
        model.load_state_dict(load_file(out_dir / "model.safetensors"))
        return model.eval()
    job = DiffusionLMJob(model, blocks, config, device)
    checkpoint = resume_point(
        out_dir, {CONFIG_NAME: config}, job.resumable, config.steps, ds_config=None, world_size=1, resume=None
    )
    run = fit(job, out_dir, checkpoint=checkpoint, progress=progress)
    with torch.no_grad():
        weights = run.ema_weights()
        for name, parameter in job.objective.named_parameters():
            if name in weights:
                parameter.copy_(weights[name])
    model.eval().cpu()
    atomic_write_bytes(out_dir / "model.safetensors", save(model.state_dict()))
    atomic_write_json(out_dir / "config.json", asdict(config))  # written last: marks the export finished
    return model
