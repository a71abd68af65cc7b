"""The one training machinery of the package (:mod:`~dihal_fast.train.trainer`: loop, plain-torch and DeepSpeed
ZeRO engines, one LR schedule, EMA, checkpoints, logs) and the bridge family on it (``train_bridge``: the
weighted DiHAL objective, teacher targets, validation bridge loss)."""
from dihal_fast.train.config import TrainConfig
from dihal_fast.train.bridge import StepInfo, export_hybrid, train_bridge
from dihal_fast.train.validation import BRIDGE_LOSS_PROTOCOL, validation_bridge_loss

__all__ = ["BRIDGE_LOSS_PROTOCOL", "StepInfo", "TrainConfig", "export_hybrid", "train_bridge", "validation_bridge_loss"]
