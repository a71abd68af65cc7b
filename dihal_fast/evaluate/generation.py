"""Sampling from plain Hugging Face causal LMs with a KV cache and float64 categorical draws."""
from __future__ import annotations

import inspect
import time
from dataclasses import dataclass

import torch

from dihal_fast.common.sampling import sample_categorical


@dataclass
class Generation:
    """Sampled continuations ``tokens[B, max_new_tokens]`` (prompt excluded) and the wall time (s)."""

    tokens: torch.Tensor
    seconds: float


def check_generation_request(prompt_len: int, n_samples: int, max_new_tokens: int, context: int) -> None:
    """Raise a clear error for zero samples, an empty prompt or a prompt + continuation past ``context``."""
    if n_samples < 1:
        raise ValueError(f"--n-samples must be >= 1, got {n_samples}")
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if prompt_len < 1:
        raise ValueError("the prompt is empty after tokenisation; give at least one token (or a BOS token)")
    if prompt_len + max_new_tokens > context:
        raise ValueError(
            f"prompt ({prompt_len} tokens) + --max-new-tokens ({max_new_tokens}) exceeds the model's context of "
            f"{context} tokens; shorten the prompt or ask for fewer tokens"
        )


def _cache_name(model) -> str:
    """Forward keyword and output attribute of the KV cache: ``cache`` in transformers 5.x,
    ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.inference_mode()
def sample_causal_lm(
    model,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Generation:
    """Ancestral sampling of ``max_new_tokens`` after ``prompt_ids[B, P]`` (no early stop at EOS).

    One forward over the prompt, then one position per step through the model's KV cache; every
    token is drawn by :func:`sample_categorical` in float64.
    """
    if prompt_ids.dim() != 2 or prompt_ids.shape[1] < 1:
        raise ValueError(f"prompt_ids must be LongTensor[B, P] with P >= 1, got {tuple(prompt_ids.shape)}")
    name = _cache_name(model)
    start = time.perf_counter()
    out = model(input_ids=prompt_ids, use_cache=True)
    cache, logits = getattr(out, name), out.logits[:, -1]
    new = []
    for step in range(max_new_tokens):
        token = sample_categorical(logits, temperature, top_k, generator).to(prompt_ids.device)
        new.append(token)
        if step + 1 < max_new_tokens:
            out = model(input_ids=token[:, None], use_cache=True, **{name: cache})
            cache, logits = getattr(out, name), out.logits[:, -1]
    return Generation(torch.stack(new, dim=1), time.perf_counter() - start)
