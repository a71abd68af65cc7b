"""Configuration dataclasses of a backbone training run (saved as ``train_config.json`` next to checkpoints)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from dihal_fast.train.settings import LoopSettings

LOG_EVERY = 10  # optimizer steps between training-loss log lines


@dataclass
class ModelConfig:
    """Shape of the Llama-architecture backbone (RoPE, RMSNorm, SwiGLU)."""

    vocab_size: int = 4096
    hidden_size: int = 256
    num_layers: int = 8
    num_heads: int = 4
    intermediate_size: int = 688
    seq_len: int = 256
    rope_theta: float = 10000.0
    tie_embeddings: bool = True

    def validate(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ValueError(
                f"hidden size {self.hidden_size} must split into {self.num_heads} heads of even size (RoPE)"
            )


@dataclass
class TrainConfig:
    """Everything that determines a training run, so that ``--resume`` can check it is the same run."""

    corpus: list[str] = field(default_factory=list)
    valid: list[str] = field(default_factory=list)
    valid_fraction: float = 0.05
    model: ModelConfig = field(default_factory=ModelConfig)
    steps: int = 3000
    batch_size: int = 16
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    precision: str = "auto"
    eval_every: int = 200
    eval_windows: int = 16
    checkpoint_every: int = 200

    def validate(self) -> None:
        self.model.validate()
        for name in ("steps", "batch_size", "eval_every", "checkpoint_every", "eval_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1 or self.warmup_steps < 0:
            raise ValueError(f"need lr > 0, 0 <= min_lr_ratio <= 1, warmup >= 0; got {self.lr}, {self.min_lr_ratio}, {self.warmup_steps}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"precision must be auto, fp32 or bf16, got {self.precision!r}")
        if not self.corpus:
            raise ValueError("no corpus files given")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def loop_settings(self, device: str = "cpu") -> LoopSettings:
        """The shared loop's view: AdamW (0.9, 0.95) with decay on matrices only, cosine to ``min_lr_ratio``."""
        return LoopSettings(steps=self.steps, batch_size=self.batch_size, lr=self.lr, warmup_steps=self.warmup_steps,
                            lr_floor=self.min_lr_ratio, weight_decay=self.weight_decay, betas=(0.9, 0.95),
                            decay_matrices_only=True, grad_clip=self.grad_clip, seed=self.seed, device=device,
                            log_every=LOG_EVERY, save_every=self.checkpoint_every, keep_checkpoints=1)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        kwargs = {key: value for key, value in data.items() if key in known}
        kwargs["model"] = ModelConfig(**data.get("model", {}))
        return cls(**kwargs)

    def differences(self, other: TrainConfig, ignore: tuple[str, ...] = ()) -> list[str]:
        """Human-readable ``field: mine != theirs`` lines (nested model fields flattened)."""
        mine, theirs = _flatten(self.to_dict()), _flatten(other.to_dict())
        return [f"{key}: {mine.get(key)!r} != {theirs.get(key)!r}" for key in sorted(set(mine) | set(theirs))
                if key not in ignore and mine.get(key) != theirs.get(key)]


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
