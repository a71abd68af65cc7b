"""The smallest adapter between this stage and ``dihal_fast.hybrid.HybridLM``: find a saved hybrid,
load it with the backbone it was cut from, and sample from it with the shared float64 sampler."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from dihal_fast.evaluate.generation import Generation

HYBRID_MARKER = "hybrid_config.json"  # written by HybridLM.save_pretrained


def find_hybrid_dir(path: Path) -> Path | None:
    """``path`` or ``path/hybrid`` (a ``dihal replace`` run) when it holds a saved hybrid, else None."""
    for candidate in (path, path / "hybrid"):
        if (candidate / HYBRID_MARKER).is_file():
            return candidate
    return None


def load_hybrid(path: Path, device: str = "cpu"):
    """``(HybridLM, tokenizer, backbone checkpoint dir)`` from a saved hybrid directory."""
    from dihal_fast.common.models import load_tokenizer, resolve_model_dir
    from dihal_fast.hybrid.model import HybridLM

    model = HybridLM.from_pretrained(path, device=device)
    if not model.config.backbone_dir:
        raise ValueError(f"the hybrid at {path} does not record the backbone directory it was cut from")
    backbone_dir = resolve_model_dir(model.config.backbone_dir)
    tokenizer = load_tokenizer(backbone_dir)
    if model.tokenizer is not None and model.tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"the hybrid at {path} carries a tokenizer that differs from its backbone's ({backbone_dir})")
    return model.eval(), tokenizer, backbone_dir


@torch.inference_mode()
def sample_hybrid(model, prompt_ids: torch.Tensor, max_new_tokens: int, temperature: float, top_k: int | None,
                  nfe: int | None, generator: torch.Generator | None) -> Generation:
    """``HybridLM.generate`` (bridge and KV caches, float64 draws), timed; the prompt is cut off."""
    start = time.perf_counter()
    out = model.generate(prompt_ids, max_new_tokens, temperature=temperature, top_k=top_k, nfe=nfe, generator=generator)
    return Generation(out.sequences[:, prompt_ids.shape[1]:], time.perf_counter() - start)
