"""What the shared training loop needs from a family's config, the loop fields declared once, and the one
learning-rate schedule.

Each family (backbone, bridge, HC-DLM, the Diffusion-LM control) keeps its own config dataclass, saved next
to its checkpoints, with its loop fields flat under the names of :class:`LoopSettings` (so saved runs, the
Python API and the flags keep their names). A family writes such a field as :func:`loop_option`: the help text,
the bounds and the flag come from :data:`LOOP_FIELDS`, only the family's default (and a note where its meaning
needs one, e.g. the schedule after the warm-up) are its own. :meth:`LoopSettings.from_config` takes the fields
over by name, with what the family fixes or derives given explicitly. The loop, the engines, the EMA and the
checkpoints read only these fields.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from dihal_fast.common.options import option
from dihal_fast.common.validation import CheckedConfig, checked

CLOCKS = ("wall", "cpu")
# The help of every command's --deepspeed option (the file is read by train.trainer.prepare_deepspeed).
DEEPSPEED_HELP = "DeepSpeed JSON config (ZeRO stage 0-3, bf16); shipped examples: $(dihal info --examples)/ds_*.json"

# Every loop field a family config may carry: its command-line help and its bounds (common.validation), the same
# in every family and in LoopSettings itself.
LOOP_FIELDS: dict[str, dict[str, Any]] = {
    "steps": {"help": "optimizer steps in total (the learning-rate schedule spans them)", "min": 1},
    "batch_size": {"help": "examples per micro-batch on each process", "min": 1},
    "grad_accum_steps": {
        "help": "micro-batches per optimizer step (gradient accumulation): the effective batch is "
        "--batch-size x this x processes",
        "min": 1,
    },
    "lr": {"help": "peak AdamW learning rate", "gt": 0.0, "max": 1.0},
    "weight_decay": {"help": "AdamW weight decay", "min": 0.0},
    "warmup_steps": {"help": "linear warm-up steps: the rate is (step + 1) / warmup of the peak", "min": 0},
    "grad_clip": {
        "help": "clip the global gradient norm to this value (0 = off; the norm is still logged)",
        "min": 0.0,
    },
    "ema_decay": {
        "help": "EMA decay of the evaluated and exported weights, with warm-up (1+s)/(10+s) (0 = no EMA)",
        "min": 0.0,
        "lt": 1.0,
    },
    "seed": {"help": "random seed of initialisation, data order and noise"},
    "log_every": {"help": "optimizer steps between lines of log.jsonl", "min": 1},
    "checkpoint_every": {"help": "optimizer steps between checkpoints (a final one is always written)", "min": 1},
    "checkpoint_minutes": {
        "help": "wall-clock minutes between checkpoints, beside --checkpoint-every (0 = by steps only)",
        "min": 0.0,
    },
    "keep_checkpoints": {"help": "newest checkpoints kept on disk", "min": 1},
    "max_minutes": {"help": "stop after this much training time (0 = no limit)", "min": 0.0},
    "budget_clock": {
        "help": "what --max-minutes measures: wall-clock or process CPU time (fair on a shared, oversubscribed "
        "machine)",
        "choices": CLOCKS,
    },
}


def loop_option(name: str, default: Any, note: str = "", **metadata: Any) -> Any:
    """The family config field ``name`` of :data:`LOOP_FIELDS` with this family's ``default``; ``note`` is
    appended to the shared help, ``metadata`` adds to the shared keys (e.g. an older ``flag`` spelling)."""
    spec = dict(LOOP_FIELDS[name])
    help_text = spec.pop("help") + (f"; {note}" if note else "")
    return option(default, help_text, **spec, **metadata)


def _loop_checked(name: str, default: Any = dataclasses.MISSING) -> Any:
    """A :class:`LoopSettings` field with the bounds of :data:`LOOP_FIELDS`."""
    return checked(default, **{key: value for key, value in LOOP_FIELDS[name].items() if key != "help"})


@dataclass(frozen=True)
class LoopSettings(CheckedConfig):
    """Optimisation and bookkeeping of one training run (derived, never saved on its own). Every field is
    checked when built (:mod:`dihal_fast.common.validation`; messages name the field, as no flag sets it)."""

    flag_names = False

    steps: int = _loop_checked("steps")
    batch_size: int = _loop_checked("batch_size")  # per process and micro-batch; checked against a DeepSpeed config
    lr: float = _loop_checked("lr")
    warmup_steps: int = _loop_checked("warmup_steps")
    lr_floor: float = checked(0.1, min=0.0, max=1.0)  # the cosine ends at lr * lr_floor; 1.0: constant after warm-up
    weight_decay: float = _loop_checked("weight_decay", 0.0)
    betas: tuple[float, float] = checked((0.9, 0.999), min=0.0, lt=1.0)
    decay_matrices_only: bool = checked(False)  # weight decay on >= 2-D parameters only (norm gains, biases exempt)
    grad_clip: float = _loop_checked("grad_clip", 1.0)
    ema_decay: float = _loop_checked("ema_decay", 0.0)
    seed: int = _loop_checked("seed", 0)
    device: str = checked("cpu")
    log_every: int = _loop_checked("log_every", 10)
    checkpoint_every: int = _loop_checked("checkpoint_every", 100)
    checkpoint_minutes: float = _loop_checked("checkpoint_minutes", 5.0)
    keep_checkpoints: int = _loop_checked("keep_checkpoints", 2)
    max_minutes: float = _loop_checked("max_minutes", 0.0)
    budget_clock: str = _loop_checked("budget_clock", "wall")
    # micro-batches per optimizer step: the effective batch is batch_size x grad_accum_steps x world size
    grad_accum_steps: int = _loop_checked("grad_accum_steps", 1)

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
