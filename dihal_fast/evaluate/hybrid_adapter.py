"""The smallest adapter between this stage and ``dihal_fast.hybrid.HybridLM``: find a saved hybrid,
load it with the backbone it was cut from, and sample from it with the shared float64 sampler."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from dihal_fast.evaluate.generation import Generation

HYBRID_MARKERS = ("hybrid_config.json",)


def find_hybrid_dir(path: Path) -> Path | None:
    """``path`` or ``path/hybrid`` when it holds a saved hybrid, else None."""
    for candidate in (path, path / "hybrid"):
        if any((candidate / marker).is_file() for marker in HYBRID_MARKERS):
            return candidate
        config = candidate / "config.json"
        if config.is_file():
            try:
                data = json.loads(config.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(data, dict) and "bridge" in data:
                return candidate
    return None


def load_hybrid(path: Path, device: str = "cpu") -> tuple[torch.nn.Module, Path]:
    """``(HybridLM, backbone checkpoint dir)`` from a saved hybrid directory."""
    try:
        from dihal_fast.hybrid import HybridLM
    except ImportError as exc:
        raise ValueError(f"{path} holds a hybrid but dihal_fast.hybrid cannot be imported: {exc}") from None
    model = HybridLM.from_pretrained(path).to(device).eval()
    return model, Path(model.config.backbone_dir)


@torch.no_grad()
def sample_hybrid(model, prompt_ids: torch.Tensor, max_new_tokens: int, temperature: float, top_k: int | None,
                  nfe: int | None, generator: torch.Generator | None) -> Generation:
    """Sampling from a hybrid (filled in against HybridLM's generation interface)."""
    raise NotImplementedError("hybrid sampling waits for dihal_fast.hybrid.HybridLM")
