"""The hybrid language model: diffusion bridge + the backbone's retained upper layers, norm and head, as a
transformers model (importing this package registers ``model_type = "dihal_hybrid"`` with the Auto classes)."""

from dihal_fast.hybrid.cache import HybridCache
from dihal_fast.hybrid.config import HybridConfig
from dihal_fast.hybrid.generation import Float64Sampling, float64_sampling
from dihal_fast.hybrid.model import HybridCausalLMOutput, HybridLM
from dihal_fast.hybrid.slicing import TESTED_FAMILIES, backbone_targets, hidden_state

__all__ = [
    "TESTED_FAMILIES",
    "Float64Sampling",
    "HybridCache",
    "HybridCausalLMOutput",
    "HybridConfig",
    "HybridLM",
    "backbone_targets",
    "hidden_state",
    "float64_sampling",
]
