"""The one training machinery of the package, used by the backbone, the bridge and HC-DLM alike.

A family describes its run as a :class:`~dihal_fast.train.trainer.TrainingJob` (objective module, batch
per step, configs) with :class:`~dihal_fast.train.settings.LoopSettings`, and calls
:func:`~dihal_fast.train.trainer.fit`: plain-torch or DeepSpeed ZeRO engine, one LR schedule, one EMA,
one checkpoint layout, the JSONL log, exact resume and time budgets.
"""

from dihal_fast.train.settings import LoopSettings, lr_factor
from dihal_fast.train.trainer import TrainingJob, TrainingRun, fit

__all__ = ["LoopSettings", "TrainingJob", "TrainingRun", "fit", "lr_factor"]
