"""What a sampling call returns, and the checks every sampling request passes before any work."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dihal_fast.errors import DihalValueError


@dataclass
class Generation:
    """Sampled continuations ``tokens[B, max_new_tokens]`` (prompt excluded) and the wall time (s)."""

    tokens: torch.Tensor
    seconds: float


def check_generation_request(prompt_len: int, n_samples: int, max_new_tokens: int, context: int) -> None:
    """Raise a clear error for zero samples, an empty prompt or a prompt + continuation past ``context``."""
    if n_samples < 1:
        raise DihalValueError(f"--n-samples must be >= 1, got {n_samples}")
    if max_new_tokens < 1:
        raise DihalValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if prompt_len < 1:
        raise DihalValueError("the prompt is empty after tokenisation; give at least one token (or a BOS token)")
    if prompt_len + max_new_tokens > context:
        raise DihalValueError(
            f"prompt ({prompt_len} tokens) + --max-new-tokens ({max_new_tokens}) exceeds the model's context of "
            f"{context} tokens; shorten the prompt or ask for fewer tokens"
        )
