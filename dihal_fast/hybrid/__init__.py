"""The hybrid language model: diffusion bridge + the backbone's retained upper layers, norm and head."""
from dihal_fast.hybrid.model import HybridCache, HybridConfig, HybridLM, HybridOutput
from dihal_fast.hybrid.slicing import SUPPORTED_FAMILIES, backbone_targets

__all__ = ["HybridCache", "HybridConfig", "HybridLM", "HybridOutput", "SUPPORTED_FAMILIES", "backbone_targets"]
