"""Configuration dataclasses of a backbone training run (saved as ``train_config.json`` next to checkpoints)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dihal_fast.common.options import option
from dihal_fast.train.settings import LoopSettings

LOG_EVERY = 10  # optimizer steps between training-loss log lines


FAMILIES = ("llama", "qwen3")  # LlamaForCausalLM, Qwen3ForCausalLM (QK-norm; grouped-query heads via --kv-heads)


@dataclass
class BackboneModelConfig:
    """Shape of the backbone: Llama (RoPE, RMSNorm, SwiGLU) or Qwen3 (the same plus RMSNorm on queries and keys)."""

    family: str = option(
        "llama", "architecture: llama = LlamaForCausalLM, qwen3 = Qwen3ForCausalLM (QK-norm)", choices=FAMILIES
    )
    vocab_size: int = option(4096, "BPE vocabulary size (incl. 3 special tokens)")
    hidden_size: int = option(256, "model width", flag="--hidden")
    num_layers: int = option(8, "transformer layers", flag="--layers")
    num_heads: int = option(4, "attention (query) heads", flag="--heads")
    num_kv_heads: int = option(0, "key/value heads (grouped-query attention; 0 = --heads)", flag="--kv-heads")
    head_dim: int = option(0, "size of one head, even (RoPE); 0 = hidden / heads")
    intermediate_size: int = option(688, "SwiGLU inner width", flag="--intermediate")
    seq_len: int = option(256, "tokens per training sequence (also the model's context)")
    rope_theta: float = option(10000.0, "RoPE base frequency")
    tie_embeddings: bool = option(True, "share the input embedding matrix with the LM head")

    def validate(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_kv_heads < 0 or self.head_dim < 0:
            raise ValueError(
                f"kv heads and head dim must be >= 0 (0 = derived), got {self.num_kv_heads}, {self.head_dim}"
            )
        if self.num_heads % self.kv_heads:
            raise ValueError(
                f"{self.num_heads} query heads do not split into groups of {self.kv_heads} key/value heads"
            )
        if not self.head_dim and self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden size {self.hidden_size} does not split into {self.num_heads} heads; pass --head-dim"
            )
        if self.head_size % 2:
            raise ValueError(f"head size {self.head_size} must be even (RoPE)")

    @property
    def kv_heads(self) -> int:
        """Key/value heads (``num_kv_heads``, or one per query head when 0)."""
        return self.num_kv_heads or self.num_heads

    @property
    def head_size(self) -> int:
        """Width of one attention head (``head_dim``, or hidden / heads when 0)."""
        return self.head_dim or self.hidden_size // self.num_heads


@dataclass
class BackboneTrainConfig:
    """Everything that determines a training run, so that ``--resume`` can check it is the same run."""

    corpus: list[str] = option(default_factory=list, help="UTF-8 training text files", required=True)
    valid: list[str] = option(default_factory=list, help="held-out UTF-8 text files (one validation split each)")
    valid_fraction: float = option(0.05, "tail fraction held out per file when no valid files exist")
    model: BackboneModelConfig = field(default_factory=BackboneModelConfig)
    steps: int = option(3000, "total optimizer steps (the LR schedule spans these)")
    batch_size: int = option(16, "sequences per micro-batch")
    grad_accum_steps: int = option(
        1,
        "micro-batches per optimizer step (gradient accumulation): the effective batch is "
        "--batch-size x this x processes",
    )
    lr: float = option(2e-3, "peak learning rate")
    min_lr_ratio: float = option(0.1, "final LR as a fraction of the peak")
    warmup_steps: int = option(100, "linear warmup steps")
    weight_decay: float = option(0.1, "AdamW weight decay on matrices")
    grad_clip: float = option(1.0, "gradient-norm clipping threshold")
    seed: int = option(0, "seed of initialisation and data order")
    precision: str = option(
        "auto",
        "bf16 autocast or fp32; auto = bf16 on CUDA or AMX CPUs, fp32 otherwise",
        choices=("auto", "fp32", "bf16"),
    )
    eval_every: int = option(200, "steps between quick validation estimates")
    eval_windows: int = option(16, "windows per split in the quick estimates")
    checkpoint_every: int = option(200, "steps between checkpoints")
    tokenizer: str = option(
        "", "reuse the tokenizer saved in this directory (e.g. another backbone's) instead of training one"
    )

    def validate(self) -> None:
        self.model.validate()
        for name in ("steps", "batch_size", "grad_accum_steps", "eval_every", "checkpoint_every", "eval_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1 or self.warmup_steps < 0:
            raise ValueError(
                f"need lr > 0, 0 <= min_lr_ratio <= 1, warmup >= 0; got {self.lr}, {self.min_lr_ratio}, "
                f"{self.warmup_steps}"
            )
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"precision must be auto, fp32 or bf16, got {self.precision!r}")
        if not self.corpus:
            raise ValueError("no corpus files given")
        if self.tokenizer and not (Path(self.tokenizer) / "tokenizer.json").is_file():
            raise FileNotFoundError(f"--tokenizer {self.tokenizer}: no tokenizer.json in that directory")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def loop_settings(self, device: str = "cpu") -> LoopSettings:
        """The shared loop's view: AdamW (0.9, 0.95) with decay on matrices only, cosine to ``min_lr_ratio``."""
        return LoopSettings(
            steps=self.steps,
            batch_size=self.batch_size,
            lr=self.lr,
            warmup_steps=self.warmup_steps,
            lr_floor=self.min_lr_ratio,
            weight_decay=self.weight_decay,
            betas=(0.9, 0.95),
            decay_matrices_only=True,
            grad_clip=self.grad_clip,
            seed=self.seed,
            device=device,
            log_every=LOG_EVERY,
            checkpoint_every=self.checkpoint_every,
            keep_checkpoints=1,
            grad_accum_steps=self.grad_accum_steps,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BackboneTrainConfig:
        known = {f.name for f in fields(cls)}
        kwargs = {key: value for key, value in data.items() if key in known}
        kwargs["model"] = BackboneModelConfig(**data.get("model", {}))
        return cls(**kwargs)

    def differences(self, other: BackboneTrainConfig, ignore: tuple[str, ...] = ()) -> list[str]:
        """Human-readable ``field: mine != theirs`` lines (nested model fields flattened)."""
        mine, theirs = _flatten(self.to_dict()), _flatten(other.to_dict())
        return [
            f"{key}: {mine.get(key)!r} != {theirs.get(key)!r}"
            for key in sorted(set(mine) | set(theirs))
            if key not in ignore and mine.get(key) != theirs.get(key)
        ]


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
