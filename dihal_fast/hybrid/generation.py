"""The package's float64 sampling protocol inside transformers' ``generate()``, for any causal LM.

:class:`Float64Sampling` is a logits processor that draws the next token itself, by
:func:`dihal_fast.common.sampling.sample_categorical` (float64 Gumbel-max after an optional float64 nucleus
cut), and returns scores under which that token is certain; ``generate`` then runs in greedy mode so no
float32 warper or multinomial draw touches the distribution::

    model.generate(ids, max_new_tokens=64, **float64_sampling(temperature=1.0, top_p=0.95, generator=g))

Plain ``model.generate(ids, do_sample=True, temperature=..., top_p=...)`` is transformers' own float32
sampler and works as well; ``dihal evaluate`` and ``dihal generate`` use this protocol.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import LogitsProcessor, LogitsProcessorList

from dihal_fast.common.sampling import sample_categorical
from dihal_fast.errors import DihalValueError


def nucleus_mask(logits: Tensor, temperature: float, top_p: float) -> Tensor:
    """``logits`` with tokens outside the smallest set of probability >= ``top_p`` set to ``-inf`` (float64)."""
    if not 0.0 < top_p <= 1.0:
        raise DihalValueError(f"top_p must lie in (0, 1], got {top_p}")
    scores = logits.detach().to(torch.float64)
    if top_p == 1.0 or temperature == 0:
        return scores
    probs = torch.softmax(scores / temperature, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of strictly more likely tokens
    drop = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, order, before >= top_p)
    return scores.masked_fill(drop, float("-inf"))


class Float64Sampling(LogitsProcessor):
    """Draw each next token in float64 (temperature 0 = argmax) and make it the only finite score."""

    def __init__(
        self,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
    ):
        if temperature < 0:
            raise DihalValueError(f"temperature must be >= 0, got {temperature}")
        if top_k is not None and top_k < 1:
            raise DihalValueError(f"top_k must be >= 1, got {top_k}")
        if not 0.0 < top_p <= 1.0:
            raise DihalValueError(f"top_p must lie in (0, 1], got {top_p}")
        self.temperature, self.top_k, self.top_p, self.generator = temperature, top_k, top_p, generator

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        logits = nucleus_mask(scores, self.temperature, self.top_p) if self.top_p < 1.0 else scores
        token = sample_categorical(logits, self.temperature, self.top_k, self.generator).to(scores.device)
        return torch.full_like(scores, float("-inf")).scatter_(-1, token[:, None], 0.0)


def float64_sampling(
    temperature: float = 1.0, top_k: int | None = None, top_p: float = 1.0, generator: torch.Generator | None = None
) -> dict:
    """``generate`` keyword arguments for the float64 protocol (greedy mode + :class:`Float64Sampling`)."""
    return {
        "do_sample": False,
        "num_beams": 1,
        "logits_processor": LogitsProcessorList([Float64Sampling(temperature, top_k, top_p, generator)]),
    }
