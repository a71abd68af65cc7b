"""Same-budget controls that the hybrid is compared with, trained through the package's one loop."""

from dihal_fast.controls.diffusion_lm import DiffusionLM, DiffusionLMConfig, train_diffusion_lm

__all__ = ["DiffusionLM", "DiffusionLMConfig", "train_diffusion_lm"]
