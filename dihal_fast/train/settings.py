"""What the shared training loop needs from a family's config, and the one learning-rate schedule.

Each family (backbone, bridge, HC-DLM, the Diffusion-LM control) keeps its own config dataclass, saved next
to its checkpoints, whose loop fields carry the names of :class:`LoopSettings`; :meth:`LoopSettings.from_config`
takes them over by name, with what the family fixes or derives given explicitly. The loop, the engines, the EMA
and the checkpoints read only these fields.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from dihal_fast.common.validation import CheckedConfig, checked

CLOCKS = ("wall", "cpu")
# The help of every command's --deepspeed option (the file is read by train.trainer.prepare_deepspeed).
DEEPSPEED_HELP = "DeepSpeed JSON config (ZeRO stage 0-3, bf16); shipped examples: $(dihal info --examples)/ds_*.json"


@dataclass(frozen=True)
class LoopSettings(CheckedConfig):
    """Optimisation and bookkeeping of one training run (derived, never saved on its own). Every field is
    checked when built (:mod:`dihal_fast.common.validation`; messages name the field, as no flag sets it)."""

    flag_names = False

    steps: int = checked(min=1)
    batch_size: int = checked(min=1)  # per process and micro-batch; checked against a DeepSpeed config
    lr: float = checked(gt=0.0)
    warmup_steps: int = checked()
    lr_floor: float = checked(0.1, min=0.0, max=1.0)  # the cosine ends at lr * lr_floor; 1.0: constant after warm-up
    weight_decay: float = checked(0.0, min=0.0)
    betas: tuple[float, float] = checked((0.9, 0.999), min=0.0, lt=1.0)
    decay_matrices_only: bool = checked(False)  # weight decay on >= 2-D parameters only (norm gains, biases exempt)
    grad_clip: float = checked(1.0, min=0.0)  # 0 = no clipping (the norm is still logged)
    ema_decay: float = checked(0.0, min=0.0, lt=1.0)  # 0 = no EMA
    seed: int = checked(0)
    device: str = checked("cpu")
    log_every: int = checked(10, min=1)
    checkpoint_every: int = checked(100, min=1)
    keep_checkpoints: int = checked(2, min=1)
    max_minutes: float = checked(0.0, min=0.0)  # stop after this much training time (0 = run all steps)
    budget_clock: str = checked("wall", choices=CLOCKS)  # what max_minutes measures: wall or cpu (process CPU time)
    # micro-batches per optimizer step: the effective batch is batch_size x grad_accum_steps x world size
    grad_accum_steps: int = checked(1, min=1)

    @classmethod
    def from_config(cls, config: object, **given: Any) -> LoopSettings:
        """The loop's view of a family's config: each field of ``config`` named as one of these (``steps``,
        ``lr``, ``seed``, ...), then ``given`` (what the family fixes or derives: ``lr_floor``, ``device``, ...)."""
        names = [spec.name for spec in dataclasses.fields(cls)]
        return cls(**{**{name: getattr(config, name) for name in names if hasattr(config, name)}, **given})


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
