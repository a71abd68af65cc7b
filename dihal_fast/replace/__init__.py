"""The replace stage's training: a bridge rebuilding hidden state l* from the embedding output, trained on the
shared loop of :mod:`dihal_fast.train` (``train_bridge``: the weighted DiHAL objective, teacher targets per
batch, the validation bridge loss, the export of the hybrid)."""

from dihal_fast.replace.config import BridgeTrainConfig
from dihal_fast.replace.job import StepInfo, export_hybrid, train_bridge
from dihal_fast.replace.validation import BRIDGE_LOSS_PROTOCOL, validation_bridge_loss

__all__ = [
    "BRIDGE_LOSS_PROTOCOL",
    "BridgeTrainConfig",
    "StepInfo",
    "export_hybrid",
    "train_bridge",
    "validation_bridge_loss",
]
