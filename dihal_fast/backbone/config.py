"""Configuration dataclasses of a backbone training run (saved as ``train_config.json`` next to checkpoints)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dihal_fast.common.options import option
from dihal_fast.common.validation import CheckedConfig, check_fields
from dihal_fast.errors import DihalValueError
from dihal_fast.train.settings import LoopSettings, loop_option

LOG_EVERY = 10  # optimizer steps between training-loss log lines


FAMILIES = ("llama", "qwen3")  # LlamaForCausalLM, Qwen3ForCausalLM (QK-norm; grouped-query heads via --kv-heads)


@dataclass
class BackboneModelConfig(CheckedConfig):
    """Shape of the backbone: Llama (RoPE, RMSNorm, SwiGLU) or Qwen3 (the same plus RMSNorm on queries and keys).
    Every field is checked when built (:mod:`dihal_fast.common.validation`), the shape's consistency too."""

    family: str = option(
        "llama", "architecture: llama = LlamaForCausalLM, qwen3 = Qwen3ForCausalLM (QK-norm)", choices=FAMILIES
    )
    vocab_size: int = option(4096, "BPE vocabulary size (incl. 3 special tokens)", min=1)
    hidden_size: int = option(256, "model width", flag="--hidden", min=1)
    num_layers: int = option(8, "transformer layers", flag="--layers", min=1)
    num_heads: int = option(4, "attention (query) heads", flag="--heads", min=1)
    num_kv_heads: int = option(0, "key/value heads (grouped-query attention; 0 = --heads)", flag="--kv-heads")
    head_dim: int = option(0, "size of one head, even (RoPE); 0 = hidden / heads")
    intermediate_size: int = option(688, "SwiGLU inner width", flag="--intermediate", min=1)
    seq_len: int = option(256, "tokens per training sequence (also the model's context)", min=1)
    rope_theta: float = option(10000.0, "RoPE base frequency", gt=0.0)
    tie_embeddings: bool = option(True, "share the input embedding matrix with the LM head")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Every field, then the shape's consistency (run when built; again after a field was changed)."""
        check_fields(self)
        if self.num_heads % self.kv_heads:
            raise DihalValueError(
                f"{self.num_heads} query heads do not split into groups of {self.kv_heads} key/value heads"
            )
        if not self.head_dim and self.hidden_size % self.num_heads:
            raise DihalValueError(
                f"hidden size {self.hidden_size} does not split into {self.num_heads} heads; pass --head-dim"
            )
        if self.head_size % 2:
            raise DihalValueError(f"head size {self.head_size} must be even (RoPE)")

    @property
    def kv_heads(self) -> int:
        """Key/value heads (``num_kv_heads``, or one per query head when 0)."""
        return self.num_kv_heads or self.num_heads

    @property
    def head_size(self) -> int:
        """Width of one attention head (``head_dim``, or hidden / heads when 0)."""
        return self.head_dim or self.hidden_size // self.num_heads


@dataclass
class BackboneTrainConfig(CheckedConfig):
    """Everything that determines a training run, so that ``--resume`` can check it is the same run. Every
    field is checked when built (:mod:`dihal_fast.common.validation`); :meth:`validate` also looks at the files."""

    legacy = {"grad_accum_steps": 1}  # fields added since runs were saved, with the value those runs used

    corpus: list[str] = option(default_factory=list, help="UTF-8 training text files", required=True)
    valid: list[str] = option(default_factory=list, help="held-out UTF-8 text files (one validation split each)")
    valid_fraction: float = option(0.05, "tail fraction held out per file when no valid files exist", gt=0.0, lt=1.0)
    model: BackboneModelConfig = field(default_factory=BackboneModelConfig)
    steps: int = loop_option("steps", 3000)
    batch_size: int = loop_option("batch_size", 16, "an example is one training window")
    grad_accum_steps: int = loop_option("grad_accum_steps", 1)
    lr: float = loop_option("lr", 2e-3, "then a cosine to --min-lr-ratio of it")
    min_lr_ratio: float = option(0.1, "final LR as a fraction of the peak", min=0.0, max=1.0)
    warmup_steps: int = loop_option("warmup_steps", 100)
    weight_decay: float = loop_option("weight_decay", 0.1, "on matrices only (norm gains exempt)")
    grad_clip: float = loop_option("grad_clip", 1.0)
    seed: int = loop_option("seed", 0)
    precision: str = option(
        "auto",
        "bf16 autocast or fp32; auto = bf16 on CUDA or AMX CPUs, fp32 otherwise",
        choices=("auto", "fp32", "bf16"),
    )
    eval_every: int = option(200, "steps between quick validation estimates", min=1)
    eval_windows: int = option(16, "windows per split in the quick estimates", min=1)
    checkpoint_every: int = loop_option("checkpoint_every", 200)
    tokenizer: str = option(
        "", "reuse the tokenizer saved in this directory (e.g. another backbone's) instead of training one"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.corpus:
            raise DihalValueError("no corpus files given (--corpus)")

    def validate(self) -> None:
        """Every field again (they may have been changed since), then the files: a reused tokenizer must exist."""
        self.model.validate()
        check_fields(self)
        if self.tokenizer and not (Path(self.tokenizer) / "tokenizer.json").is_file():
            raise FileNotFoundError(f"--tokenizer {self.tokenizer}: no tokenizer.json in that directory")

    def loop_settings(self, device: str = "cpu") -> LoopSettings:
        """The shared loop's view: AdamW (0.9, 0.95) with decay on matrices only, cosine to ``min_lr_ratio``."""
        return LoopSettings.from_config(
            self,
            lr_floor=self.min_lr_ratio,
            betas=(0.9, 0.95),
            decay_matrices_only=True,
            device=device,
            log_every=LOG_EVERY,
            keep_checkpoints=1,
        )
