"""Bridge training: the weighted DiHAL objective, plain-torch and DeepSpeed ZeRO engines, checkpoints,
EMA, logs, validation bridge loss; ``train_bridge`` is the entry point."""
from dihal_fast.train.config import TrainConfig
from dihal_fast.train.loop import StepInfo, export_hybrid, train_bridge
from dihal_fast.train.validation import BRIDGE_LOSS_PROTOCOL, validation_bridge_loss

__all__ = ["BRIDGE_LOSS_PROTOCOL", "StepInfo", "TrainConfig", "export_hybrid", "train_bridge", "validation_bridge_loss"]
