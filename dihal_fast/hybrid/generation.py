"""Autoregressive sampling from a HybridLM with both caches: each new token costs one position in the
bridge's context encoder, ``nfe`` denoiser evaluations on that position, and one position through the
retained layers' KV cache. Tokens are drawn in float64 (:func:`dihal_fast.common.sampling.sample_categorical`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dihal_fast.common.sampling import sample_categorical


@dataclass
class HybridGeneration:
    """``sequences`` ``(B, P + new)`` (prompt included) and, if asked, the logits each token was drawn from."""

    sequences: Tensor
    logits: Tensor | None = None


def nucleus_mask(logits: Tensor, temperature: float, top_p: float) -> Tensor:
    """``logits`` with tokens outside the smallest set of probability >= ``top_p`` set to ``-inf`` (float64)."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
    scores = logits.detach().to(torch.float64)
    if top_p == 1.0 or temperature == 0:
        return scores
    probs = torch.softmax(scores / temperature, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of strictly more likely tokens
    drop = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, order, before >= top_p)
    return scores.masked_fill(drop, float("-inf"))


@torch.inference_mode()
def generate(model, input_ids: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             top_p: float = 1.0, nfe: int | None = None, sampler: str | None = None, seed: int | None = None,
             generator: torch.Generator | None = None, attention_mask: Tensor | None = None,
             return_logits: bool = False) -> HybridGeneration:
    """Sample ``max_new_tokens`` after each row of ``input_ids`` ``(B, P)`` (left padding via ``attention_mask``).

    ``seed`` fixes both the bridge noise and the token draws; a ``generator`` instead draws the tokens
    (and the noise seed, when ``seed`` is None). With neither, both come from torch's global RNG.
    Incremental decoding gives the logits a full forward of the final sequence with the same seed gives.
    """
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must be LongTensor[B, P] with P >= 1, got {tuple(input_ids.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    limit = model.config.max_position_embeddings
    if limit and input_ids.shape[1] + max_new_tokens > limit:
        raise ValueError(f"prompt ({input_ids.shape[1]}) + max_new_tokens ({max_new_tokens}) exceeds the context of {limit} tokens")
    if seed is None and generator is not None:
        seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
    cache = model.new_cache(seed)
    if generator is None:
        generator = torch.Generator().manual_seed(cache.seed)
    mask = attention_mask
    tokens, kept = input_ids, []
    step_input = input_ids
    for _ in range(max_new_tokens):
        logits = model(step_input, attention_mask=mask, cache=cache, nfe=nfe, sampler=sampler).logits[:, -1]
        if return_logits:
            kept.append(logits.float())
        scores = nucleus_mask(logits, temperature, top_p) if top_p < 1.0 else logits
        step_input = sample_categorical(scores, temperature, top_k, generator).to(input_ids.device)[:, None]
        tokens = torch.cat([tokens, step_input], dim=1)
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
    return HybridGeneration(tokens, torch.stack(kept, dim=1) if return_logits else None)
