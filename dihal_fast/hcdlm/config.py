"""Configuration dataclasses of an HC-DLM run, saved as JSON next to every checkpoint."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from dihal_fast.common import atomic_write_json, read_json
from dihal_fast.tasks.registry import TaskConfig

MODEL_KINDS = ("hcdlm", "latent", "mdm", "ar")
KERNELS = ("uniform", "absorbing")
REMASKS = ("auto", "random", "confidence")


@dataclass
class ModelConfig:
    """Architecture. Baselines use ``hidden``/``heads`` and as many blocks as fit the HC-DLM budget."""

    kind: str = "hcdlm"
    hidden: int = 64
    heads: int = 4
    # The solving is the denoiser's: at width 64 the encoder reconstructs 100 % within a few hundred steps.
    encoder_blocks: int = 1
    denoiser_blocks: int = 6
    predictor_blocks: int = 1
    latents: int = 1  # M continuous latent vectors
    latent_dim: int = 64  # d, size of each latent vector
    kernel: str = "uniform"  # discrete forward kernel of the token scaffold
    dropout: float = 0.0
    baseline_blocks: int = 0  # 0 = as many as match the HC-DLM parameter count
    slot_head: bool = True  # a training-only per-slot token head on the denoiser (for ObjectiveConfig.slot_aux_weight)

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"model must be one of {MODEL_KINDS}, got {self.kind!r}")
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        for name in ("hidden", "heads", "encoder_blocks", "denoiser_blocks", "predictor_blocks", "latents", "latent_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


TOKEN_WEIGHTINGS = ("all", "schedule")
CONT_WEIGHTINGS = ("none", "min_snr")


@dataclass
class ObjectiveConfig:
    """Weights of the HC-DLM objective and the choices around it.

    The paper's (Proposition 1 and its Eqs. 25-27): ``lambda_recon``, ``lambda_ent`` (on the summed
    Gaussian log-density), ``lambda_cont``, the per-step token term ``-log p(k0 | x_hat_0(x_t, k_t, t))``
    read by the one time-invariant head, the 15 %-mask auxiliary on masked positions, the scaffold
    dropout for guidance. Ours (departures, each an option): ``lambda_token``'s value, the ``min_snr``
    form of the continuous weight ``omega_t`` (the paper names omega_t without a closed form here),
    ``detach_latents`` and the exposure-robust share ``exposure_share``.
    """

    lambda_recon: float = 1.0
    lambda_ent: float = 8e-3
    lambda_cont: float = 0.5
    # Per-step token term: CE of the predictor read from the denoiser's x_hat_0, trained through both.
    lambda_token: float = 1.0
    # "all": mean CE over every position (the uniform kernel's bound); "schedule": CE on the corrupted
    # positions weighted by 1/s (the absorbing kernel's masked-diffusion ELBO weighting).
    token_weighting: str = "all"
    # omega_t of the continuous term: "none" (1) or "min_snr" (min(SNR(s), 5) / 5, SNR = ((1-s)/s)^2).
    cont_weighting: str = "none"
    mask_aux_weight: float = 0.2
    mask_aux_rate: float = 0.15
    scaffold_drop: float = 0.2  # share of scaffolds replaced by random tokens (classifier-free guidance)
    timesteps: int = 1000  # T; one t ~ U{1..T} per example
    # Stop the regression term's gradient into the encoder. Without it, small CPU runs collapse the
    # latents to a constant (regression -> 0, reconstruction stuck at copying the givens).
    detach_latents: bool = True
    # Share of each batch whose (x_t, k_t) are built from the model's own no-grad prediction at a higher
    # noise level (exposure to its own samples; ours, not the paper's). 0 = off.
    exposure_share: float = 1.0
    # Share of examples whose x_t carries no signal (pure noise, level s kept): trains the scaffold -> x_hat_0
    # path, which a denoiser that can copy x_t's signal otherwise never learns (ours, not the paper's). 0 = off.
    latent_drop: float = 0.0
    # Weight of a training-only CE of a per-slot head on the denoiser's slot states (deep supervision, ours):
    # a direct signal per cell, where the token term reaches the slots only through the M x d latent. 0 = off.
    slot_aux_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.token_weighting not in TOKEN_WEIGHTINGS:
            raise ValueError(f"token_weighting must be one of {TOKEN_WEIGHTINGS}, got {self.token_weighting!r}")
        if self.cont_weighting not in CONT_WEIGHTINGS:
            raise ValueError(f"cont_weighting must be one of {CONT_WEIGHTINGS}, got {self.cont_weighting!r}")
        for name in ("mask_aux_rate", "scaffold_drop", "exposure_share", "latent_drop"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.timesteps < 1:
            raise ValueError(f"timesteps must be >= 1, got {self.timesteps}")


@dataclass
class TrainConfig:
    steps: int = 10000
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 100
    grad_clip: float = 1.0
    ema: float = 0.999
    seed: int = 0
    max_minutes: float = 0.0  # training-time budget; 0 = run all steps
    budget_clock: str = "wall"  # "wall" or "cpu" (process CPU time: fair on a shared, oversubscribed machine)
    log_every: int = 25
    checkpoint_every: int = 250
    threads: int = 0  # torch threads; 0 = leave torch's default
    device: str = "auto"  # auto (cuda when torch sees one), cpu, cuda, cuda:N

    def __post_init__(self) -> None:
        if self.budget_clock not in ("wall", "cpu"):
            raise ValueError(f"budget_clock must be 'wall' or 'cpu', got {self.budget_clock!r}")


@dataclass
class SampleConfig:
    """How to generate: steps for diffusion models, guidance, re-masking, MDM order, temperature."""

    steps: int = 50
    cfg_weight: float = 0.0  # 0 = no guidance; the paper samples with 2.75
    # Which scaffold tokens are re-noised each step: "random" (each with prob. s), "confidence" (the
    # round(s L) least confident), or "auto" = the paper's rule (uniform: random; absorbing: confidence).
    remask: str = "auto"
    order: str = "margin"  # MDM unmasking order: "prob" (top-probability) or "margin"
    temperature: float = 0.0  # 0 = argmax tokens (puzzles); 1 = sample (text), always in float64
    batch_size: int = 128
    # HC-DLM: replace x_hat_0 by the encoder mean of its own argmax tokens at every step (ours, not the paper's).
    clamp: bool = False

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"sampling steps must be >= 1, got {self.steps}")
        if self.remask not in REMASKS:
            raise ValueError(f"remask must be one of {REMASKS}, got {self.remask!r}")
        if self.order not in ("prob", "margin"):
            raise ValueError(f"MDM order must be 'prob' or 'margin', got {self.order!r}")


# What a saved config without these (newer) fields meant: the model and objective before they existed,
# so older runs load and resume as they were trained.
LEGACY = {"model": {"slot_head": False},
          "objective": {"lambda_token": 0.0, "exposure_share": 0.0, "slot_aux_weight": 0.0}}


@dataclass
class RunConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RunConfig":
        parts = {"task": TaskConfig, "model": ModelConfig, "objective": ObjectiveConfig, "train": TrainConfig}
        try:
            return cls(**{name: kind(**{**LEGACY.get(name, {}), **data.get(name, {})}) for name, kind in parts.items()})
        except TypeError as exc:
            raise ValueError(f"run config has unknown or missing fields: {exc}") from None

    def save(self, path: Path) -> None:
        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: Path) -> "RunConfig":
        return cls.from_dict(read_json(path, "run config"))
