"""Cutting a Hugging Face causal LM at hidden state ``l``: the embedding output ``c(x)`` (the bridge's
condition), the teacher's ``h_l``, and the retained layers ``l+1..L`` + final norm + LM head as a smaller
model of the same family that takes ``h_l`` as ``inputs_embeds``.

The retained part is built from the backbone's own config with ``num_hidden_layers = L - l`` (per-layer
attributes such as ``layer_types`` sliced alike), so rotary embeddings, masks, sliding windows and the KV
cache are the model's own code; fed the true ``h_l`` it reproduces the backbone's logits exactly.
"""
from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

SUPPORTED_FAMILIES = ("llama", "mistral", "qwen3", "gpt2")
_LAYER_KEY = re.compile(r"^(.*\.(?:layers|h))\.(\d+)\.(.*)$")
# Per-layer config lists that must be cut like the layers themselves.
_PER_LAYER_ATTRIBUTES = ("layer_types",)


def check_family(config) -> str:
    """The backbone's ``model_type``; an error that names the supported families otherwise."""
    family = getattr(config, "model_type", None)
    if family not in SUPPORTED_FAMILIES:
        raise ValueError(
            f"backbone family {family!r} is not supported by the hybrid; supported families: "
            f"{', '.join(SUPPORTED_FAMILIES)}"
        )
    return family


def check_layer(config, layer: int) -> int:
    """``layer`` checked to lie in ``1 .. L-1`` (``L`` = the backbone's number of layers)."""
    total = config.num_hidden_layers
    if not isinstance(layer, int) or not 1 <= layer <= total - 1:
        raise ValueError(f"layer must be an integer in 1..{total - 1} for this {total}-layer backbone, got {layer!r}")
    return layer


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks of a supported causal LM."""
    return model.transformer.h if check_family(model.config) == "gpt2" else model.model.layers


def upper_config(config, layer: int):
    """Config of the retained part: ``L - layer`` layers, per-layer attributes sliced alike."""
    check_family(config)
    check_layer(config, layer)
    upper = copy.deepcopy(config)
    upper.num_hidden_layers = config.num_hidden_layers - layer
    for name in _PER_LAYER_ATTRIBUTES:
        values = getattr(config, name, None)
        if values is not None:
            setattr(upper, name, list(values)[layer:])
    return upper


def upper_state_dict(state: dict[str, Tensor], layer: int, family: str) -> dict[str, Tensor]:
    """The backbone's weights for the retained part: layers ``>= layer`` renumbered from 0.

    GPT-2's learned position table is added by its model to ``inputs_embeds``; ``h_l`` already holds the
    positions, so the retained part gets a zero table (the real one becomes part of the condition).
    """
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        match = _LAYER_KEY.match(key)
        if match:
            index = int(match.group(2))
            if index < layer:
                continue
            key = f"{match.group(1)}.{index - layer}.{match.group(3)}"
        out[key] = value
    if family == "gpt2":
        out["transformer.wpe.weight"] = torch.zeros_like(state["transformer.wpe.weight"])
    return out


def build_upper(model: nn.Module, layer: int) -> nn.Module:
    """A new causal LM (same family, own copy of the weights) = layers ``layer+1..L``, norm and head."""
    from transformers import AutoModelForCausalLM

    config = upper_config(model.config, layer)
    upper = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    upper.load_state_dict(upper_state_dict(model.state_dict(), layer, config.model_type), strict=True)
    return upper.eval()


def position_table(model: nn.Module) -> nn.Embedding | None:
    """A copy of GPT-2's learned position embedding (part of ``c(x)``); ``None`` for rotary families."""
    if check_family(model.config) != "gpt2":
        return None
    return copy.deepcopy(model.transformer.wpe)


def embedding_output(model: nn.Module, input_ids: Tensor, positions: Tensor, table: nn.Embedding | None) -> Tensor:
    """``c(x)``: the backbone's hidden state 0 (token embedding, plus GPT-2's position embedding)."""
    embedded = model.get_input_embeddings()(input_ids)
    return embedded if table is None else embedded + table(positions)


@contextmanager
def tap_hidden_state(model: nn.Module, layer: int) -> Iterator[list[Tensor]]:
    """Record the output of decoder layer ``layer`` (1-based, i.e. hidden state ``h_layer``) on forward."""
    captured: list[Tensor] = []

    def hook(module, args, output):
        captured.append(output[0] if isinstance(output, tuple) else output)

    handle = decoder_layers(model)[layer - 1].register_forward_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()


@torch.no_grad()
def backbone_targets(model: nn.Module, input_ids: Tensor, layer: int, attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The teacher's ``(h_layer (B, T, D), logits (B, T, V))`` from one inference forward pass."""
    with tap_hidden_state(model, layer) as captured:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    return captured[-1], logits
