"""Cutting a Hugging Face causal LM at hidden state ``l``: the embedding output ``c(x)`` (the bridge's
condition), the teacher's ``h_l``, and the retained layers ``l+1..L`` + final norm + LM head as a smaller
model of the same family that takes ``h_l`` as ``inputs_embeds``.

Any decoder-only causal LM that follows the transformers conventions can be cut (checked by capability, not
by name): its base model holds the decoder blocks as a ``ModuleList`` called ``layers`` (Llama, Mistral,
Qwen2/3, Gemma/Gemma2, Phi3, GPT-NeoX, ...) or ``h`` (GPT-2), its weights are named ``...layers.N...``, and the
input of the first block is its input embedding (plus, for GPT-2-like models, a learned position table
``wpe``, which becomes part of the condition). The retained part is built from the backbone's own config with
``num_hidden_layers = L - l`` (per-layer attributes such as ``layer_types`` sliced alike), so rotary
embeddings, masks, sliding windows and the KV cache are the model's own code. :func:`verify_cut` runs a probe
through both and refuses a model for which the retained part fed the true ``h_l`` does not reproduce the
backbone's logits, or whose first block does not see the input embedding, saying which.

A backbone spread over several devices (``device_map``, ``hf_device_map``) gets a hybrid whose retained part runs
where the backbone's own layers do (:func:`place_like_backbone`); the bridge and the condition sit on the device
of the input embedding, and :func:`backbone_targets` returns the teacher's targets on the device of its inputs.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from dihal_fast.common.decoder_layers import LAYER_LISTS, block_output, layer_list
from dihal_fast.errors import DihalValueError
from dihal_fast.hybrid.config import MODEL_TYPE

# The families the tests cut and run (tiny random checkpoints); others are accepted when they pass the checks.
TESTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gpt2", "gpt_neox")
_LAYER_KEY = re.compile(r"^(.*\.(?:layers|h))\.(\d+)\.(.*)$")
_LAYER_MODULE = re.compile(r"^(.*\.(?:layers|h))\.(\d+)((?:\..*)?)$")  # a device-map key: a layer or inside one
# Per-layer config lists that must be cut like the layers themselves.
_PER_LAYER_ATTRIBUTES = ("layer_types",)


def check_family(config) -> str:
    """The backbone's ``model_type``, checked from its config alone to be a decoder-only causal LM with a
    layer count (what :func:`upper_config` needs); a ValueError that says why it cannot be cut otherwise."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    family = getattr(config, "model_type", None)
    if family == MODEL_TYPE:
        reason = "it is a hybrid already; cut the backbone it was cut from (its config.json's backbone_dir)"
    elif getattr(config, "is_encoder_decoder", False):
        reason = "it is an encoder-decoder model (the hybrid replaces the first layers of a decoder-only LM)"
    elif family in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        reason = "it is a bidirectional encoder (is_decoder = False), not a causal LM"
    elif family not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        reason = "transformers has no causal-LM class for this model type"
    elif not isinstance(getattr(config, "num_hidden_layers", None), int):
        reason = "its config has no num_hidden_layers to cut"
    else:
        return family
    raise DihalValueError(f"backbone family {family!r} cannot be cut into a hybrid: {reason}")


def check_layer(config, layer: int) -> int:
    """``layer`` checked to lie in ``1 .. L-1`` (``L`` = the backbone's number of layers)."""
    total = config.num_hidden_layers
    if not isinstance(layer, int) or not 1 <= layer <= total - 1:
        raise DihalValueError(
            f"layer must be an integer in 1..{total - 1} for this {total}-layer backbone, got {layer!r}"
        )
    return layer


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks of a causal LM: its base model's ``layers`` or ``h`` list of ``num_hidden_layers`` blocks."""
    family = check_family(model.config)
    layers = layer_list(model.base_model, model.config.num_hidden_layers)
    if layers is None:
        raise DihalValueError(
            f"backbone family {family!r} cannot be cut into a hybrid: its base model "
            f"({type(model.base_model).__name__}) has no ModuleList of {model.config.num_hidden_layers} decoder blocks "
            f"named {' or '.join(LAYER_LISTS)}"
        )
    return layers


def _sliced_config(config, layers: slice):
    """A deep copy of ``config`` holding the decoder layers ``layers`` of it (per-layer attributes sliced alike)."""
    check_family(config)
    part = copy.deepcopy(config)
    part.num_hidden_layers = len(range(config.num_hidden_layers)[layers])
    for name in _PER_LAYER_ATTRIBUTES:
        values = getattr(config, name, None)
        if values is not None:
            setattr(part, name, list(values)[layers])
    return part


def upper_config(config, layer: int):
    """Config of the retained part: ``L - layer`` layers, per-layer attributes sliced alike."""
    check_family(config)
    check_layer(config, layer)
    return _sliced_config(config, slice(layer, None))


def copied_config(config, layers: int) -> dict:
    """The Hugging Face config (as a dict) of the backbone's layers ``1..layers`` as a base model that the bridge's
    context encoder runs on ``c(x)`` (``inputs_embeds``): per-layer attributes sliced alike, a one-row token
    embedding (the condition is the backbone's embedding output, computed outside)."""
    lower = _sliced_config(config, slice(None, layers))
    lower.vocab_size = 1
    lower.pad_token_id = lower.bos_token_id = lower.eos_token_id = None  # no token ids in a one-row vocabulary
    settings = json.loads(lower.to_json_string())
    return {k: v for k, v in settings.items() if k not in ("_name_or_path", "architectures", "auto_map")}


def copy_lower_layers(copied: nn.Module, backbone: nn.Module, layers: int) -> None:
    """Load the backbone's decoder layers ``1..layers`` (and its other base-model weights except the token
    embedding) into ``copied`` (a base model built from :func:`copied_config`); a learned position table becomes
    zero, as is the one-row token embedding (``c(x)`` comes in whole). Refuses (ValueError) a layer tensor left
    unloaded."""
    base = backbone.base_model
    source = {}
    for key, value in base.state_dict().items():
        match = _LAYER_KEY.match(f".{key}")
        if match and int(match.group(2)) >= layers:
            continue
        source[key] = value
    target = copied.state_dict()
    loadable = {k: v for k, v in source.items() if k in target and target[k].shape == v.shape}
    missing = [k for k in target if _LAYER_KEY.match(f".{k}") and k not in loadable]
    if missing:
        raise DihalValueError(f"the backbone's layers do not fit the copied layers' config: {missing[:4]}")
    copied.load_state_dict(loadable, strict=False)
    unused = [copied.get_input_embeddings(), getattr(copied, "wpe", None)]  # c(x) comes in as inputs_embeds
    for table in unused:
        if isinstance(table, nn.Embedding):
            nn.init.zeros_(table.weight)  # not left random: a saved hybrid is a function of the backbone


def share_unsaved_buffers(upper: nn.Module, backbone: nn.Module, layer: int) -> None:
    """Give a retained part built on the meta device the backbone's buffers that no state dict carries
    (non-persistent ones: rotary frequency tables, embedding scales), layers renumbered as in
    :func:`upper_state_dict`, shared and in the backbone's own dtype: the retained layers compute what the
    backbone's do (a bf16 backbone loaded from its files keeps float32 rotary tables, and so does a saved hybrid
    when it loads); refuse (ValueError) if any tensor is left on the meta device."""
    sources = upper_state_dict(dict(backbone.named_buffers()), layer, None)
    for name, buffer in list(upper.named_buffers()):
        if buffer.is_meta and name in sources:
            module_name, _, leaf = name.rpartition(".")
            upper.get_submodule(module_name)._buffers[leaf] = sources[name]  # constants, shared like the weights
    left = [name for name, t in [*upper.named_parameters(), *upper.named_buffers()] if t.is_meta]
    if left:
        raise DihalValueError(f"the retained part of the cut has tensors the backbone does not give: {left[:4]}")


def position_table_key(model: nn.Module) -> str | None:
    """State-dict key of a learned absolute position table added to the input embedding (GPT-2's ``wpe``)."""
    base_prefix = model.base_model_prefix
    table = getattr(model.base_model, "wpe", None)
    return f"{base_prefix}.wpe.weight" if isinstance(table, nn.Embedding) else None


def upper_state_dict(state: dict[str, Tensor], layer: int, position_key: str | None) -> dict[str, Tensor]:
    """The backbone's weights for the retained part: layers ``>= layer`` renumbered from 0.

    A learned position table (``position_key``) is added by its model to ``inputs_embeds``; ``h_l`` already
    holds the positions, so the retained part gets a zero table (the real one becomes part of the condition).
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
    if position_key is not None:
        out[position_key] = torch.zeros_like(state[position_key])
    return out


def position_table(model: nn.Module) -> nn.Embedding | None:
    """A copy of a learned position embedding added to the input embedding (part of ``c(x)``), else ``None``."""
    return copy.deepcopy(model.base_model.wpe) if position_table_key(model) is not None else None


def embedding_output(model: nn.Module, input_ids: Tensor, positions: Tensor, table: nn.Embedding | None) -> Tensor:
    """``c(x)``: the backbone's hidden state 0 (token embedding, plus a learned position embedding if any)."""
    embedded = model.get_input_embeddings()(input_ids)
    return embedded if table is None else embedded + table(positions.to(table.weight.device)).to(embedded.device)


@contextmanager
def tap_hidden_state(model: nn.Module, layer: int) -> Iterator[list[Tensor]]:
    """Record the output of decoder layer ``layer`` (1-based, i.e. hidden state ``h_layer``) on forward."""
    captured: list[Tensor] = []

    def hook(module, args, output):
        captured.append(block_output(output))

    handle = decoder_layers(model)[layer - 1].register_forward_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()


class _Stop(Exception):
    """Raised by :func:`hidden_states_up_to`'s hook to end a forward pass once the deepest wanted layer has run."""


@torch.no_grad()
def hidden_states_up_to(
    model: nn.Module, input_ids: Tensor, layers: Sequence[int], attention_mask: Tensor | None = None
) -> dict[int, Tensor]:
    """``{l: h_l (B, T, D)}`` for decoder layers ``layers`` (1-based) from a forward pass that stops after the
    deepest of them (the layers above it, the head and the logits are never computed)."""
    captured: dict[int, Tensor] = {}
    deepest = max(layers)

    def record(layer: int):
        def hook(module, args, output):
            captured[layer] = block_output(output)
            if layer == deepest:
                raise _Stop

        return hook

    blocks = decoder_layers(model)
    handles = [blocks[layer - 1].register_forward_hook(record(layer)) for layer in layers]
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return captured


def hidden_state(model: nn.Module, input_ids: Tensor, layer: int, attention_mask: Tensor | None = None) -> Tensor:
    """The teacher's ``h_layer`` ``(B, T, D)`` from a pass stopped after decoder layer ``layer``
    (:func:`hidden_states_up_to`), on the device of ``input_ids``."""
    return hidden_states_up_to(model, input_ids, [layer], attention_mask)[layer].to(input_ids.device)


@torch.no_grad()
def backbone_targets(
    model: nn.Module, input_ids: Tensor, layer: int, attention_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The teacher's ``(h_layer (B, T, D), logits (B, T, V))`` from one inference forward pass, on the device of
    ``input_ids`` (a spread backbone computes ``h_layer`` on the device of decoder layer ``layer``)."""
    with tap_hidden_state(model, layer) as captured:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    return captured[-1].to(input_ids.device), logits.to(input_ids.device)


def reproduces(got: Tensor, want: Tensor, scale_of: Tensor, low_precision: float = 2e-2) -> bool:
    """Whether a probe's ``got`` equals ``want`` up to the rounding of ``scale_of``'s dtype: relative ``1e-4`` in
    float32/64, ``low_precision`` in narrower dtypes, with an absolute slack of that times ``max |scale_of| + 1``."""
    tolerance = 1e-4 if scale_of.dtype in (torch.float32, torch.float64) else low_precision
    scale = float(scale_of.abs().max()) + 1.0
    return torch.allclose(got.float(), want.float(), atol=tolerance * scale, rtol=tolerance)


@torch.no_grad()
def verify_cut(backbone: nn.Module, upper: nn.Module, layer: int, table: nn.Embedding | None, length: int = 8) -> None:
    """Refuse (ValueError) a cut that does not reproduce the backbone on a probe: the first block must see
    :func:`embedding_output`, and the retained part fed the true ``h_l`` must give the backbone's logits."""
    family = backbone.config.model_type
    device = backbone.get_input_embeddings().weight.device
    ids = (torch.arange(length, device=device) * 7 + 3).remainder(backbone.config.vocab_size)[None]
    positions = torch.arange(length, device=device)[None]
    first_input: list[Tensor] = []
    handle = decoder_layers(backbone)[0].register_forward_pre_hook(
        lambda module, args, kwargs: first_input.append(args[0] if args else kwargs["hidden_states"]), with_kwargs=True
    )
    try:
        hidden, logits = backbone_targets(backbone, ids, layer)
    finally:
        handle.remove()
    condition = embedding_output(backbone, ids, positions, table)
    if not first_input or not reproduces(first_input[0].to(condition.device), condition, logits):
        raise DihalValueError(
            f"backbone family {family!r} cannot be cut into a hybrid: its first decoder block does not see "
            "the input embedding (the model transforms it first, e.g. a norm or scale outside the embedding module)"
        )
    rebuilt = upper(inputs_embeds=hidden, position_ids=positions, use_cache=False).logits.to(logits.device)
    if not reproduces(rebuilt, logits, logits):
        raise DihalValueError(
            f"backbone family {family!r} cannot be cut into a hybrid: its layers {layer + 1}.."
            f"{backbone.config.num_hidden_layers} rebuilt as a smaller model and fed the true h_{layer} do not "
            f"reproduce its logits (max difference {float((rebuilt - logits).abs().max()):.3g})"
        )


def spread_map(model: nn.Module) -> dict[str, int | str] | None:
    """A model's ``hf_device_map`` when accelerate spread it over more than one device, else ``None``."""
    device_map = getattr(model, "hf_device_map", None)
    return dict(device_map) if device_map and len(set(device_map.values())) > 1 else None


def upper_device_map(device_map: dict[str, int | str], layer: int) -> dict[str, int | str]:
    """The backbone's device map for the retained part: keys of layers ``< layer`` dropped, later layers
    renumbered from 0 (as :func:`upper_state_dict` renumbers the weights); other keys (embeddings, norm, head,
    a whole layer list) kept."""
    out: dict[str, int | str] = {}
    for key, device in device_map.items():
        match = _LAYER_MODULE.match(key)
        if match:
            index = int(match.group(2))
            if index < layer:
                continue
            key = f"{match.group(1)}.{index - layer}{match.group(3)}"
        out[key] = device
    return out


def place_like_backbone(hybrid: nn.Module, backbone: nn.Module, layer: int) -> None:
    """Move ``hybrid`` (bridge, condition table, retained part ``hybrid.upper``) to ``backbone``'s device(s).

    A backbone on one device: ``hybrid.to(device)``. A spread one (:func:`spread_map`): the retained part is
    dispatched by accelerate with the backbone's map (:func:`upper_device_map`), so each retained layer runs on
    the device holding the backbone's tensors it shares and its hooks move the hidden states in between (outputs
    come back to the device of the inputs); the rest of the hybrid goes to the device of the input embedding."""
    device_map = spread_map(backbone)
    device = backbone.get_input_embeddings().weight.device
    if device_map is None:
        hybrid.to(next(backbone.parameters()).device)
        return
    from accelerate import dispatch_model

    # main_device as a string: accelerate compares it with "cpu"
    dispatch_model(hybrid.upper, upper_device_map(device_map, layer), main_device=str(device))
    for name, child in hybrid.named_children():
        if name != "upper":
            child.to(device)
