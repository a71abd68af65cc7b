"""What the shared training loop needs from a family's config, and the one learning-rate schedule.

Each family (backbone, bridge, HC-DLM) keeps its own config dataclass, saved next to its checkpoints,
and maps it onto :class:`LoopSettings` with a ``loop_settings()`` method; the loop, the engines, the
EMA and the checkpoints read only these fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CLOCKS = ("wall", "cpu")
# The help of every command's --deepspeed option (the file is read by train.trainer.prepare_deepspeed).
DEEPSPEED_HELP = "DeepSpeed JSON config (ZeRO stage 0-3, bf16); shipped examples: $(dihal info --examples)/ds_*.json"


@dataclass(frozen=True)
class LoopSettings:
    """Optimisation and bookkeeping of one training run (derived, never saved on its own)."""

    steps: int
    batch_size: int  # per process and micro-batch; checked against a DeepSpeed config
    lr: float
    warmup_steps: int
    lr_floor: float = 0.1  # the cosine ends at lr * lr_floor; 1.0 keeps the rate constant after warm-up
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    decay_matrices_only: bool = False  # weight decay on >= 2-D parameters only (norm gains and biases exempt)
    grad_clip: float = 1.0  # 0 = no clipping (the norm is still logged)
    ema_decay: float = 0.0  # 0 = no EMA
    seed: int = 0
    device: str = "cpu"
    log_every: int = 10
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    max_minutes: float = 0.0  # stop after this much training time (0 = run all steps)
    budget_clock: str = "wall"  # what max_minutes measures: "wall" or "cpu" (process CPU time)
    # micro-batches per optimizer step: the effective batch is batch_size x grad_accum_steps x world size
    grad_accum_steps: int = 1

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "log_every", "checkpoint_every", "keep_checkpoints", "grad_accum_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0 or self.warmup_steps < 0 or not 0.0 <= self.lr_floor <= 1.0:
            raise ValueError(
                f"need lr > 0, warmup_steps >= 0 and 0 <= lr_floor <= 1; got {self.lr}, {self.warmup_steps}, "
                f"{self.lr_floor}"
            )
        if self.weight_decay < 0 or self.grad_clip < 0 or self.max_minutes < 0:
            raise ValueError("weight_decay, grad_clip and max_minutes must be >= 0")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must lie in [0, 1), got {self.ema_decay}")
        if self.budget_clock not in CLOCKS:
            raise ValueError(f"budget_clock must be one of {CLOCKS}, got {self.budget_clock!r}")


def lr_factor(step: int, settings: LoopSettings) -> float:
    """Multiplier of the peak rate at optimizer step ``step`` (0-based).

    Linear warm-up ``(step + 1) / warmup_steps``, then a half cosine from 1 to ``lr_floor`` at
    ``steps`` (constant when ``lr_floor`` is 1). The first step already trains, unlike
    ``transformers.get_cosine_schedule_with_warmup`` (factor 0 at step 0, no floor).
    """
    if step < settings.warmup_steps:
        return (step + 1) / settings.warmup_steps
    if settings.lr_floor == 1.0:
        return 1.0
    progress = min(1.0, (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps))
    return settings.lr_floor + (1.0 - settings.lr_floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
