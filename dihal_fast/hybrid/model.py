"""HybridLM: the diffusion bridge in place of backbone layers ``1..l``, then the retained layers ``l+1..L``,
the final norm and the LM head, as a transformers ``PreTrainedModel`` with ``generate()``.

A saved hybrid directory is self-contained and loads with the Auto classes::

    config.json             HybridConfig (model_type "dihal_hybrid", auto_map, bridge + retained-part configs)
    model.safetensors       bridge.*, upper.* (the retained causal LM), condition_position_table.* (GPT-2)
    generation_config.json  the backbone's generation defaults (eos / pad / bos ids, ...)
    dihal_hybrid.py         the auto_map module: names the dihal_fast version that wrote it, imports the installed
                            dihal_fast classes
    tokenizer files         the backbone's tokenizer

``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`` loads it in any process where
``dihal_fast`` is installed; after ``import dihal_fast.hybrid`` the Auto classes know the model type without
``trust_remote_code``. The backbone is not needed to load, score or generate. A load is whole or refused
(:func:`dihal_fast.common.hf_loading.load_whole`'s checks), and ``save_pretrained`` writes into a folder as
transformers does: file by file, each atomically, leaving what it does not write.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationConfig,
    GenerationMixin,
    PreTrainedModel,
)
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from dihal_fast._version import __version__
from dihal_fast.bridge import Bridge, position_noise
from dihal_fast.common.deepspeed_banner import without_deepspeed_banner
from dihal_fast.common.devices import resolve_device
from dihal_fast.common.hf_loading import (
    LOAD_ERRORS,
    check_attn_implementation,
    check_device_map,
    check_layer_count,
    check_loading_info,
    check_stored_shapes,
    load_failure,
    stored_tensor_shapes,
)
from dihal_fast.common.io import write_into
from dihal_fast.errors import DihalError, DihalTypeError, DihalValueError
from dihal_fast.hybrid import slicing
from dihal_fast.hybrid.cache import HybridCache
from dihal_fast.hybrid.config import (
    FORMAT,
    MODEL_TYPE,
    REMOTE_MODULE,
    HybridConfig,
    check_bridge_dtype,
    check_nfe,
    check_not_legacy,
    check_seed,
)

logger = logging.getLogger(__name__)
# True while from_backbone builds a hybrid whose retained part it then assigns from the backbone: the retained
# part is built on the meta device (HybridLM.__init__), the bridge on the CPU as always.
_UPPER_ON_META: contextvars.ContextVar[bool] = contextvars.ContextVar("_UPPER_ON_META", default=False)


def _foldable_head_input(module: nn.Module, args: tuple) -> tuple | None:
    """The head's ``(B, T, D)`` input as one matrix when its leading dimensions do not fold into one (the last
    tokens' slice that transformers takes for ``logits_to_keep``, with the whole prompt's strides): torch's matmul
    folds such an input only when the weight requires grad, so the frozen head went through ``bmm``, which copies
    the transposed ``(V, D)`` weight at every call (a bf16 prefill on a CPU at 0.4x the backbone's). The copy made
    here is ``B x T x D`` values."""
    hidden = args[0] if args else None
    if not isinstance(hidden, Tensor) or hidden.dim() != 3 or hidden.stride(0) == hidden.stride(1) * hidden.shape[1]:
        return None
    return (hidden.clone(memory_format=torch.contiguous_format), *args[1:])


@torch.no_grad()
def _verify_copied(hybrid: HybridLM, backbone: nn.Module, layers: int, length: int = 8) -> None:
    """Refuse (ValueError) copied layers that do not reproduce the backbone's ``h_layers`` on a probe."""
    device = backbone.get_input_embeddings().weight.device
    ids = (torch.arange(length, device=device) * 7 + 3).remainder(backbone.config.vocab_size)[None]
    positions = torch.arange(length, device=device)[None]
    expected, _ = slicing.backbone_targets(backbone, ids, layers)
    copied = hybrid.bridge.copied_hidden_state(hybrid.condition(ids, positions), positions, None, None)
    if not slicing.reproduces(copied, expected, expected, low_precision=3e-2):
        raise DihalValueError(
            f"backbone family {backbone.config.model_type!r}: its layers 1..{layers} copied into the bridge do not "
            f"reproduce h_{layers} (max difference {float((copied.float() - expected.float()).abs().max()):.3g})"
        )


@dataclass
class HybridCausalLMOutput(CausalLMOutputWithPast):
    """``CausalLMOutputWithPast`` plus ``bridge_hidden_state`` ``(B, T, D)``: the ``h_l`` the bridge produced
    (or the oracle given), which the retained layers decoded."""

    bridge_hidden_state: Tensor | None = None


_REMOTE_CODE = '''"""Loads a dihal_fast hybrid with transformers' Auto classes (trust_remote_code=True).

Written by dihal_fast {version} (directory format {format}). The model code is the installed package's
(pip install dihal_fast); this file only names it. Loading under another release series of dihal_fast says
so in one line (config.json's package_version).
"""
WRITTEN_BY = "{version}"
from dihal_fast.hybrid.model import HybridConfig, HybridLM  # noqa: F401
'''
_CONTEXT_BLOCK = re.compile(r"^bridge\.context\.(\d+)\.")  # the bridge's context-encoder blocks in the weights
# The weight files transformers' save_pretrained writes (one file, or shards + index): ours to replace.
_WEIGHT_FILE = re.compile(r"^model(-\d+-of-\d+)?\.safetensors$|^model\.safetensors\.index\.json$")


class HybridLM(PreTrainedModel, GenerationMixin):
    """Bridge + retained layers; build with :meth:`from_backbone`, load with :meth:`from_pretrained`.

    ``forward`` is a causal LM's (``input_ids, attention_mask, labels, cache / past_key_values, use_cache``)
    plus the bridge's knobs: ``nfe`` and ``sampler`` (denoising steps, config defaults), ``seed`` (the noise:
    see :class:`HybridConfig`; an explicit seed draws per-row noise from it) and ``hidden_state_oracle``
    (decode a given ``h_l``: the true one reproduces the backbone's logits).
    """

    config_class = HybridConfig
    base_model_prefix = "hybrid"
    main_input_name = "input_ids"
    _no_split_modules = ["Bridge"]  # noqa: RUF012  (transformers declares these as plain lists)
    # The bridge follows the load dtype (config bridge_dtype "auto") except float16, whose range it was never checked
    # in (transformers' fp16 guard); bridge_dtype "float32" keeps it float32 (__init__ sets the strict list).
    _keep_in_fp32_modules = ["bridge"]  # noqa: RUF012
    # attn_implementation applies to the retained layers (the bridge's attention is its own).
    _supports_sdpa = True
    _supports_flash_attn = True
    supports_gradient_checkpointing = True

    def __init__(self, config: HybridConfig):
        attention = config._attn_implementation  # what the caller asked for (None: each part's own default)
        super().__init__(config)
        self.loss_type = "ForCausalLM"
        self.gradient_checkpointing = False  # the bridge as one segment; the retained layers are transformers'
        # The retained part first: .dtype (first floating parameter) is then the checkpoint's dtype.
        dtype = config.dtype if isinstance(config.dtype, torch.dtype) else None  # from_pretrained sets the load dtype
        with torch.device("meta") if _UPPER_ON_META.get() else contextlib.nullcontext():  # see from_backbone
            self.upper = AutoModelForCausalLM.from_config(
                config.upper_model_config(), dtype=dtype, **({"attn_implementation": attention} if attention else {})
            ).eval()  # eval: see train()
        self.bridge = Bridge(config.bridge_config)
        self.condition_position_table = (
            nn.Embedding(config.max_position_embeddings, config.hidden_size) if config.learned_positions else None
        )
        self.tokenizer: Any = None  # set by from_backbone / from_pretrained; saved beside the weights
        # checked here too: from_pretrained sets its keyword arguments on the config after the config's own checks
        if check_bridge_dtype(config.bridge_dtype, "hybrid config bridge_dtype") == "float32":
            self._keep_in_fp32_modules_strict = {"bridge"}  # from_pretrained's dtype plan reads the instance's
        self.post_init()
        if self.condition_position_table is not None:
            self.condition_position_table.requires_grad_(False)
        self.set_upper_trainable(not config.freeze_upper)

    def get_input_embeddings(self) -> nn.Module:
        """The backbone's token embedding (the retained part's), which also makes the bridge's condition."""
        return self.upper.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.upper.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Module | None:
        """The retained part's LM head."""
        return self.upper.get_output_embeddings()

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.upper.set_output_embeddings(value)

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """Resize the retained part's embedding and head (transformers' rules, ties kept) and the configs'
        ``vocab_size``; embeddings and head stay frozen as before (:meth:`set_upper_trainable`)."""
        embeddings = self.upper.resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        size = int(embeddings.weight.shape[0])
        self.config.vocab_size = size
        self.config.upper = {**self.config.upper, "vocab_size": size}
        self.set_upper_trainable(not self.config.freeze_upper)
        return embeddings

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing: the bridge initialises itself and the retained part comes from the backbone or the file."""

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoModel") -> None:
        """No-op: :meth:`save_pretrained` writes the ``auto_map`` module itself."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """False: ``forward`` creates its own :class:`HybridCache` (bridge + retained layers) when asked."""
        return False

    def prepare_inputs_for_generation(
        self,
        input_ids: Tensor,
        next_sequence_length: int | None = None,
        cache: HybridCache | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        is_first_iteration: bool | None = False,
        **kwargs,
    ) -> dict:
        """What ``generate`` feeds ``forward`` each step: the new tokens, the cache, the mask and the rest of the
        keyword arguments (``nfe``, ``seed``, ...); the general version's work for compiled caches, multimodal
        inputs and embeddings does not apply to the hybrid and costs time at every token."""
        if inputs_embeds is not None:
            raise DihalValueError(
                "the hybrid takes input_ids (its condition is the token embedding), not inputs_embeds"
            )
        if next_sequence_length is not None:
            input_ids = input_ids[:, -next_sequence_length:]
        inputs = {key: value for key, value in kwargs.items() if key not in ("labels", "position_ids")}
        position_ids = kwargs.get("position_ids")
        if position_ids is not None:
            inputs["position_ids"] = position_ids[:, -input_ids.shape[1] :]
        inputs.update(input_ids=input_ids, cache=cache, attention_mask=attention_mask)
        return inputs

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_backbone(
        cls,
        backbone: nn.Module,
        layer: int,
        bridge_config: dict | None = None,
        tokenizer=None,
        backbone_dir: str | os.PathLike = "",
        freeze_upper: bool = True,
        copy_weights: bool = True,
    ) -> HybridLM:
        """A hybrid replacing layers ``1..layer`` of ``backbone`` with a fresh bridge (``bridge_config`` overrides).

        The retained part keeps the backbone's dtype; the bridge is float32 (see README, "dtype"). The bridge's
        copied layers get the backbone's weights, or keep their fresh initialisation with ``copy_weights=False``
        (the from-scratch control, ``dihal replace --copied-init random``).
        """
        from dihal_fast.bridge import BridgeConfig

        family = slicing.check_family(backbone.config)
        slicing.check_layer(backbone.config, layer)
        slicing.decoder_layers(backbone)
        hidden = backbone.config.hidden_size
        options = dict(bridge_config or {})
        if options.get("copied_layers", 0):
            options["copied_config"] = slicing.copied_config(backbone.config, options["copied_layers"])
        bridge = BridgeConfig(hidden_size=hidden, condition_size=hidden, layer=layer, **options)
        upper_config = slicing.upper_config(backbone.config, layer)
        upper_config.dtype = next(backbone.parameters()).dtype  # the weights' dtype, whatever the config file said
        backbone_config = json.loads(backbone.config.to_json_string())
        config = HybridConfig(
            family=family,
            layer=layer,
            backbone_layers=backbone.config.num_hidden_layers,
            max_position_embeddings=int(getattr(backbone.config, "max_position_embeddings", 0) or 0),
            vocab_size=int(backbone.config.vocab_size),
            hidden_size=int(hidden),
            bridge=bridge.to_dict(),
            upper={k: v for k, v in json.loads(upper_config.to_json_string()).items() if k != "_name_or_path"},
            backbone_dir=str(Path(backbone_dir).resolve()) if backbone_dir else "",
            backbone_config=backbone_config,
            freeze_upper=freeze_upper,
            learned_positions=slicing.position_table_key(backbone) is not None,
            **{name: getattr(backbone.config, name, None) for name in ("bos_token_id", "eos_token_id", "pad_token_id")},
        )
        # Frozen, the retained part is the backbone's own tensors (assigned below): it is built on the meta device,
        # so no randomly initialised copy of it (as large as the retained layers) is ever allocated.
        frozen = _UPPER_ON_META.set(freeze_upper)
        try:
            with torch.device("cpu"):
                hybrid = cls(config)
        finally:
            _UPPER_ON_META.reset(frozen)
        dtype = next(backbone.parameters()).dtype
        position_key = slicing.position_table_key(backbone)
        # Frozen retained layers reference the backbone's own tensors (assign): the teacher of bridge training and
        # the hybrid share one copy of the upper layers, embeddings and head per process; trainable ones are copies.
        hybrid.upper.to(dtype).load_state_dict(
            slicing.upper_state_dict(backbone.state_dict(), layer, position_key), strict=True, assign=freeze_upper
        )
        if freeze_upper:
            slicing.share_unsaved_buffers(hybrid.upper, backbone, layer)  # rotary tables: in no state dict
        if freeze_upper and getattr(hybrid.upper.config, "tie_word_embeddings", False):
            hybrid.upper.tie_weights()  # assign gave the head its own Parameter object; one again, as saved
        table = slicing.position_table(backbone)
        if table is not None:
            hybrid.condition_position_table.to(dtype).load_state_dict(table.state_dict())
        copied = hybrid.bridge.copied is not None and copy_weights
        if copied:
            slicing.copy_lower_layers(hybrid.bridge.copied, backbone, bridge.copied_layers)
        slicing.place_like_backbone(hybrid, backbone, layer)  # a spread backbone: on its devices
        slicing.verify_cut(backbone, hybrid.upper, layer, table)
        if copied:
            _verify_copied(hybrid, backbone, bridge.copied_layers)
        if getattr(backbone, "generation_config", None) is not None:
            hybrid.generation_config = GenerationConfig.from_dict(backbone.generation_config.to_dict())
        hybrid.tokenizer = tokenizer
        return hybrid

    def use_bridge_dtype(self, bridge_dtype: str) -> None:
        """Run the bridge in float32 or (``auto``) in the retained part's dtype (float32 beside a float16 one), and
        record it in the config (a later ``save_pretrained`` keeps the choice). Its target statistics stay float32
        either way. A bridge already rounded to a narrower dtype is refused float32 (its float32 weights are gone:
        load it again)."""
        check_bridge_dtype(bridge_dtype)
        auto = bridge_dtype == "auto" and self.upper.dtype != torch.float16
        dtype = self.upper.dtype if auto else torch.float32
        if self.bridge.dtype.itemsize < dtype.itemsize:
            raise DihalValueError(
                f"the bridge is already {str(self.bridge.dtype).removeprefix('torch.')}: its float32 weights are "
                "gone; load the hybrid again to run the bridge in float32"
            )
        self.config.bridge_dtype = bridge_dtype
        self.bridge.to(dtype)
        self._keep_in_fp32_modules_strict = {"bridge"} if bridge_dtype == "float32" else set()

    def set_upper_trainable(self, trainable: bool) -> None:
        """Unfreeze (or freeze) the retained decoder layers and final norm; embeddings and head stay frozen."""
        embeddings = [self.upper.get_input_embeddings(), self.upper.get_output_embeddings()]
        frozen_always = {id(p) for module in embeddings if module is not None for p in module.parameters()}
        table = getattr(self.upper.base_model, "wpe", None)
        frozen_always |= {id(p) for p in table.parameters()} if isinstance(table, nn.Module) else set()
        for parameter in self.upper.parameters():
            parameter.requires_grad_(trainable and id(parameter) not in frozen_always)
        self.config.freeze_upper = not trainable

    def check_backbone(self, backbone: nn.Module) -> None:
        """Raise ValueError unless ``backbone`` holds the weights this hybrid was cut from.

        Compares the retained part (embeddings, head, and the frozen layers and norm) tensor by tensor, so a
        checkpoint directory that was overwritten since the hybrid was trained is caught before it is used
        as a reference.
        """
        family = slicing.check_family(backbone.config)
        if backbone.config.num_hidden_layers != self.config.backbone_layers or family != self.config.family:
            raise DihalValueError(
                f"the backbone is a {backbone.config.num_hidden_layers}-layer {family}, this hybrid was cut "
                f"from a {self.config.backbone_layers}-layer {self.config.family} ({self.config.backbone_dir})"
            )
        expected = slicing.upper_state_dict(
            backbone.state_dict(), self.config.layer, slicing.position_table_key(backbone)
        )
        trained = {name for name, p in self.upper.named_parameters() if p.requires_grad}
        for name, value in self.upper.state_dict().items():
            if name in trained:
                continue
            other = expected.get(name)
            if other is None or other.shape != value.shape or not torch.equal(other.to(value), value):
                raise DihalValueError(
                    f"the backbone's {name} differs from the one this hybrid was cut from "
                    f"({self.config.backbone_dir}); was that checkpoint replaced after training?"
                )

    def train(self, mode: bool = True) -> HybridLM:
        """Train mode for the bridge only: the retained layers and the bridge's copied backbone layers keep eval
        behaviour (no dropout), as the teacher.

        The retained decoder blocks themselves (not their attention or MLP) follow ``mode``, so that transformers'
        gradient checkpointing, which runs only in training, recomputes them; nothing else in a block reads it."""
        super().train(mode)
        self.upper.eval()
        if self.bridge.copied is not None:
            self.bridge.copied.eval()
        for module in self.upper.modules():
            if isinstance(module, GradientCheckpointingLayer):
                module.training = mode
        return self

    # ----------------------------------------------------------------- forward
    def condition(self, input_ids: Tensor, positions: Tensor) -> Tensor:
        """``c(x)`` ``(B, T, D)``: the backbone's embedding output (token + GPT-2 position embedding)."""
        return slicing.embedding_output(self.upper, input_ids, positions, self.condition_position_table)

    @staticmethod
    def positions(input_ids: Tensor, attention_mask: Tensor | None, past: int) -> Tensor:
        """Position ids ``(B, T)``: ``past + arange(T)``, or counted over non-padding tokens of the mask."""
        batch, length = input_ids.shape
        if attention_mask is None:
            return torch.arange(past, past + length, device=input_ids.device).expand(batch, length)
        if attention_mask.shape != (batch, past + length):
            raise DihalValueError(
                f"attention_mask must have shape {(batch, past + length)} (cached + new tokens), got "
                f"{tuple(attention_mask.shape)}"
            )
        return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]

    def noise_definition(self, seed: int | None = None) -> tuple[int, bool]:
        """``(seed, shared_rows)`` of the bridge's noise: an explicit ``seed`` (per-row draws); else the config's
        fixed ``noise_seed`` shared by all rows, or, with ``stochastic_noise``, a seed from torch's global RNG."""
        if seed is not None:
            return check_seed(seed, "seed"), False
        if self.config.stochastic_noise:
            return int(torch.randint(0, 2**62, (1,)).item()), False
        return int(self.config.noise_seed), True

    def new_cache(self, seed: int | None = None) -> HybridCache:
        """An empty cache for incremental decoding, holding the noise of :meth:`noise_definition` (``seed``)."""
        seed, shared = self.noise_definition(seed)
        return HybridCache(self.upper.config, self.bridge.config.context_layers, seed, shared)

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: HybridCache | None = None,
        labels: Tensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        *,
        past_key_values: HybridCache | None = None,
        nfe: int | None = None,
        sampler: str | None = None,
        seed: int | None = None,
        hidden_state_oracle: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> HybridCausalLMOutput | tuple:
        """Logits ``(B, T, V)`` for ``input_ids`` ``(B, T)`` (continuing ``cache`` when given), the shifted-label
        loss with ``labels`` (ignore index -100), and the cache with ``use_cache``.

        ``output_hidden_states``: the bridge's ``h_l`` (as the retained part's dtype) then each retained layer's
        output, the retained model's own tuple; ``output_attentions``: the retained layers' attention weights
        (they need ``attn_implementation="eager"``)."""
        if input_ids is None or inputs_embeds is not None:
            raise DihalValueError(
                "the hybrid takes input_ids (its condition is the token embedding), not inputs_embeds"
            )
        attention = self.upper.config._attn_implementation
        if output_attentions and attention != "eager":
            raise DihalValueError(
                f"output_attentions needs the retained layers on eager attention (they run {attention}): load "
                "with attn_implementation='eager'"
            )
        cache = cache if cache is not None else past_key_values
        if cache is not None and not isinstance(cache, HybridCache):
            raise DihalTypeError(f"cache must be a HybridCache (model.new_cache()), got {type(cache).__name__}")
        if cache is None and use_cache:
            cache = self.new_cache(seed)
        past = cache.length if cache is not None else 0
        limit = self.config.max_position_embeddings
        if limit and past + input_ids.shape[1] > limit:
            raise DihalValueError(
                f"{past} cached + {input_ids.shape[1]} new tokens exceeds the context of {limit} tokens"
            )
        positions = self.positions(input_ids, attention_mask, past)
        if position_ids is not None:
            if position_ids.shape != input_ids.shape:
                raise DihalValueError(
                    f"position_ids must have shape {tuple(input_ids.shape)}, got {tuple(position_ids.shape)}"
                )
            positions = position_ids.to(input_ids.device)
        key_mask = None if attention_mask is None or bool(attention_mask.all()) else attention_mask
        condition = self.condition(input_ids, positions)
        bridge_cache = cache.bridge if cache is not None else None
        if hidden_state_oracle is None:
            noise_seed, shared = (cache.seed, cache.shared_noise) if cache is not None else self.noise_definition(seed)
            steps = self.bridge.config.nfe if nfe is None else check_nfe(nfe)
            noise = position_noise(noise_seed, positions, steps, self.bridge.config.hidden_size, shared_rows=shared)
            arguments = (condition, positions, key_mask, noise.to(positions.device), steps, sampler, bridge_cache)
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled() and bridge_cache is None:
                hidden = self._gradient_checkpointing_func(self.bridge_hidden_state, *arguments)
            else:
                hidden = self.bridge_hidden_state(*arguments)
        else:
            hidden = hidden_state_oracle
            if cache is not None:  # keep the bridge cache in step with the retained layers
                self.bridge.encode(condition, positions, key_mask, bridge_cache)
        upper = self.retained_output(
            hidden,
            attention_mask,
            positions,
            cache,
            logits_to_keep,
            bool(output_hidden_states),
            bool(output_attentions),
        )
        logits = upper.logits
        loss = self.loss_function(logits, labels, self.config.vocab_size) if labels is not None else None
        out = HybridCausalLMOutput(
            loss=loss,
            logits=logits,
            cache=cache if use_cache or cache is not None else None,
            hidden_states=upper.hidden_states if output_hidden_states else None,
            attentions=upper.attentions if output_attentions else None,
            bridge_hidden_state=hidden,
        )
        return out if return_dict is not False else out.to_tuple()

    def bridge_hidden_state(
        self,
        condition: Tensor,
        positions: Tensor,
        key_mask: Tensor | None,
        noise: Tensor,
        steps: int,
        sampler: str | None,
        bridge_cache=None,
    ) -> Tensor:
        """The bridge's ``h_l`` ``(B, T, D)``: context encoding of ``c(x)``, then ``steps`` denoising steps from
        ``noise`` (one segment of gradient checkpointing)."""
        context = self.bridge.encode(condition, positions, key_mask, bridge_cache)
        return self.bridge.denormalize(self.bridge.sample(context, noise, steps, sampler, bridge_cache))

    def decode(self, *args, **kwargs) -> Tensor:
        """Logits ``(B, T, V)`` of the retained layers + norm + head applied to hidden state ``h_l``
        (:meth:`retained_output`'s arguments)."""
        return self.retained_output(*args, **kwargs).logits

    def retained_output(
        self,
        hidden: Tensor,
        attention_mask: Tensor | None,
        positions: Tensor,
        upper_cache=None,
        logits_to_keep: int = 0,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> CausalLMOutputWithPast:
        """The retained model's output for hidden state ``h_l`` (logits, and its hidden states / attentions when
        asked)."""
        dtype = self.upper.get_input_embeddings().weight.dtype
        head = self.upper.get_output_embeddings()
        if head is not None and not getattr(head, "_dihal_foldable_input", False):
            head.register_forward_pre_hook(_foldable_head_input)  # once per head module (resizing replaces it)
            head._dihal_foldable_input = True
        return self.upper(
            inputs_embeds=hidden.to(dtype),
            attention_mask=attention_mask,
            position_ids=positions,
            cache=upper_cache,
            use_cache=upper_cache is not None,
            logits_to_keep=logits_to_keep,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )

    # ----------------------------------------------------------------- persistence
    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs) -> Path:
        """The transformers layout (see the module docstring) plus the ``auto_map`` module and the tokenizer
        (when :attr:`tokenizer` is set), written into ``save_directory`` as transformers does: each file replaced
        atomically, the folder's other files left alone (a tokenizer saved there before, a Trainer's
        ``checkpoint-N`` folders), only weight files of an earlier save that this one does not write removed;
        never through a symbolic link (:func:`dihal_fast.common.io.write_into`)."""
        directory = Path(save_directory)
        self.config.bridge = self.bridge.config.to_dict()  # target statistics may have been set on the module
        self.config.package_version = __version__
        written: set[str] = set()

        def write(folder: Path) -> None:
            super(HybridLM, self).save_pretrained(folder, **kwargs)
            (folder / f"{REMOTE_MODULE}.py").write_text(_REMOTE_CODE.format(version=__version__, format=FORMAT))
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(folder)
            written.update(path.name for path in folder.iterdir())

        with without_deepspeed_banner():
            write_into(directory, write)
        for stale in directory.iterdir():
            if _WEIGHT_FILE.match(stale.name) and stale.name not in written and stale.is_file():
                stale.unlink()
        return directory

    @classmethod
    def check_stored_weights(cls, path: Path, config: HybridConfig) -> None:
        """Before anything is allocated: the retained layers and the bridge's context blocks the config names are
        in the safetensors headers, and every stored tensor has the shape the config gives it (the hybrid built on
        the meta device); one line naming what does not fit."""
        shapes = stored_tensor_shapes(path)
        if shapes is None:
            return
        upper = [name for name in shapes if name.startswith("upper.")]
        check_layer_count(path, config.upper_model_config().num_hidden_layers, upper, "upper.num_hidden_layers")
        blocks = {int(match.group(1)) for match in map(_CONTEXT_BLOCK.match, shapes) if match}
        wanted = config.bridge_config.context_layers
        if wanted > len(blocks):
            raise DihalValueError(
                f"{path}/config.json says bridge.context_layers = {wanted}, but its weights hold {len(blocks)} "
                "context blocks; refusing to make up the others"
            )
        with torch.device("meta"):
            skeleton = cls(config)
        check_stored_shapes(path, skeleton, shapes)

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, *args, device: str | None = None, **kwargs
    ) -> HybridLM | tuple[HybridLM, dict]:
        """Load a saved hybrid whole (``device`` is a shortcut for ``.to(device)``), or refuse in one line: a
        directory in the layout of earlier versions (with the conversion command), a config out of range or
        naming more retained layers than the weights hold (before anything is allocated), tensors missing,
        unexpected or of another shape, a device or attention implementation that cannot run here."""
        path = Path(pretrained_model_name_or_path)
        local = path.is_absolute() or path.exists() or str(path).startswith(".")
        if local:
            if not path.is_dir():
                raise FileNotFoundError(f"hybrid directory does not exist: {path}")
            check_not_legacy(path)
            if not (path / "config.json").is_file():
                raise FileNotFoundError(f"hybrid directory {path} lacks config.json")
        check_device_map(kwargs.get("device_map"))
        given = kwargs.get("config")  # the Auto classes pass the config, attn_implementation moved into it
        check_attn_implementation(kwargs.get("attn_implementation", getattr(given, "_attn_implementation", None)))
        if device is not None:
            resolve_device(str(device))
        with_info = kwargs.pop("output_loading_info", False)
        kwargs.setdefault("ignore_mismatched_sizes", True)  # a tensor of another shape is refused below, by name
        try:
            if local:
                config = HybridConfig.from_pretrained(path)
                cls.check_stored_weights(path, config)
            model, info = super().from_pretrained(
                pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs
            )
        except DihalError:
            raise
        except LOAD_ERRORS as exc:
            raise load_failure(path, exc) from exc
        check_loading_info(path, info)
        if model.bridge.copied is not None:  # the load made fresh parameters: frozen again as the config says
            model.bridge.copied.requires_grad_(model.bridge.config.train_copied_layers)
        if path.is_dir() and (path / "tokenizer_config.json").is_file():
            from transformers import AutoTokenizer

            model.tokenizer = AutoTokenizer.from_pretrained(path)
        model = model.eval()
        model = model.to(device) if device is not None else model
        return (model, info) if with_info else model


AutoConfig.register(MODEL_TYPE, HybridConfig, exist_ok=True)
AutoModelForCausalLM.register(HybridConfig, HybridLM, exist_ok=True)
