"""Where a transformers base model keeps its decoder blocks: a ``ModuleList`` called ``layers`` (Llama, Mistral,
Qwen, Gemma, Phi3, GPT-NeoX, ...) or ``h`` (GPT-2). Shared by the cut of a backbone and the bridge's copied layers."""

from __future__ import annotations

from torch import Tensor, nn

LAYER_LISTS = ("layers", "h")


def layer_list(base_model: nn.Module, count: int | None = None) -> nn.ModuleList | None:
    """The base model's decoder blocks (of ``count`` blocks when given), or ``None`` when it has no such list."""
    for name in LAYER_LISTS:
        layers = getattr(base_model, name, None)
        if isinstance(layers, nn.ModuleList) and (count is None or len(layers) == count):
            return layers
    return None


def block_output(output: object) -> Tensor:
    """The hidden states a decoder block returned (blocks of some families return a tuple, others the tensor)."""
    return output[0] if isinstance(output, tuple) else output
