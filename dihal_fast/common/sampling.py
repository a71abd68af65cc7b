"""Categorical sampling in float64.

Float32 Gumbel / categorical sampling truncates the tail of the distribution (a uniform draw in
float32 cannot produce the tiny probabilities of rare tokens), which lowers the effective
temperature and makes generative perplexity look better than it is (Zheng et al. 2024). Every
sampler in this package draws tokens through :func:`sample_categorical`.
"""

from __future__ import annotations

import torch

from dihal_fast.errors import DihalValueError

PROTOCOL = "float64 Gumbel-max over float64 log-softmax(logits / temperature); temperature 0 = argmax"


def sample_categorical(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One token id per row of ``logits[..., V]`` -> ``LongTensor[...]``, drawn in float64.

    ``temperature`` divides the logits (0 gives the argmax); ``top_k`` keeps only the k largest
    logits per row. The draw is Gumbel-max with float64 uniforms, which is exact sampling from
    ``softmax(logits / temperature)`` computed in float64.
    """
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise DihalValueError(
            f"logits must have a non-empty last (vocabulary) dimension, got shape {tuple(logits.shape)}"
        )
    if temperature < 0:
        raise DihalValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and not 1 <= top_k:
        raise DihalValueError(f"top_k must be >= 1, got {top_k}")
    scores = logits.detach().to(torch.float64)
    if top_k is not None and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if temperature == 0:
        return scores.argmax(dim=-1)
    log_probs = torch.log_softmax(scores / temperature, dim=-1)
    device = generator.device if generator is not None else log_probs.device
    uniform = torch.rand(log_probs.shape, dtype=torch.float64, generator=generator, device=device)
    uniform = uniform.to(log_probs.device).clamp_min(torch.finfo(torch.float64).tiny)
    gumbel = -torch.log(-torch.log(uniform))
    return (log_probs + gumbel).argmax(dim=-1)
