"""HybridLM: the diffusion bridge in place of backbone layers ``1..l``, then the retained layers
``l+1..L``, the final norm and the LM head.

A saved hybrid directory is self-contained::

    hybrid_config.json      HybridConfig (family, layer, bridge config with target statistics, ...)
    bridge.safetensors      bridge weights (and GPT-2's position table, part of the condition)
    upper/                  the retained part as a Hugging Face checkpoint (config.json + safetensors)
    backbone_config.json    the full backbone's config
    tokenizer files         the backbone's tokenizer
"""
from __future__ import annotations

import inspect
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from dihal_fast.bridge import Bridge, BridgeCache, BridgeConfig, position_noise
from dihal_fast.bridge.serial import DictConfig
from dihal_fast.common import atomic_write_json, read_json
from dihal_fast.hybrid import slicing

logger = logging.getLogger(__name__)

FORMAT = "dihal_fast.hybrid"
_TABLE_PREFIX = "condition_position_table."


@dataclass
class HybridConfig(DictConfig):
    """Where the hybrid was cut and from what (saved as ``hybrid_config.json``)."""

    family: str
    layer: int
    backbone_layers: int
    backbone_dir: str
    max_position_embeddings: int
    bridge: BridgeConfig
    freeze_upper: bool = True
    format: str = FORMAT

    @classmethod
    def from_dict(cls, data: dict) -> HybridConfig:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} config (format = {data.get('format') if isinstance(data, dict) else None!r})")
        bridge = BridgeConfig.from_dict(data.get("bridge", {}))
        return super().from_dict({**data, "bridge": bridge})


@dataclass
class HybridOutput:
    """``logits`` ``(B, T, V)``, the hidden state fed to the retained layers ``(B, T, D)``, the cache."""

    logits: Tensor
    hidden_state: Tensor
    cache: HybridCache | None = None


class HybridCache:
    """Everything incremental decoding keeps: bridge keys/values, retained-layer KV cache, noise seed."""

    def __init__(self, bridge: BridgeCache, upper, seed: int):
        self.bridge, self.upper, self.seed = bridge, upper, seed

    @property
    def length(self) -> int:
        return self.bridge.length


def _new_upper_cache(config):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=config)
    except TypeError:  # transformers 4.x: no config argument
        return DynamicCache()


class HybridLM(nn.Module):
    """Bridge + retained layers; build with :meth:`from_backbone`, load with :meth:`from_pretrained`."""

    def __init__(self, config: HybridConfig, bridge: Bridge, upper: nn.Module, position_table: nn.Embedding | None = None,
                 tokenizer=None, backbone_config: dict | None = None):
        super().__init__()
        self.config, self.bridge, self.upper = config, bridge, upper
        self.condition_position_table = position_table
        self.tokenizer = tokenizer
        self.backbone_config = backbone_config or {}
        self._cache_keyword = "cache" if "cache" in inspect.signature(upper.forward).parameters else "past_key_values"
        if position_table is not None:
            position_table.requires_grad_(False)
        self.set_upper_trainable(not config.freeze_upper)

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_backbone(cls, backbone: nn.Module, layer: int, bridge_config: dict | None = None, tokenizer=None,
                      backbone_dir: str | os.PathLike = "", freeze_upper: bool = True) -> HybridLM:
        """A hybrid replacing layers ``1..layer`` of ``backbone`` with a fresh bridge (``bridge_config`` overrides)."""
        family = slicing.check_family(backbone.config)
        slicing.check_layer(backbone.config, layer)
        hidden = backbone.config.hidden_size
        bridge = Bridge(BridgeConfig(hidden_size=hidden, condition_size=hidden, layer=layer, **(bridge_config or {})))
        config = HybridConfig(
            family=family, layer=layer, backbone_layers=backbone.config.num_hidden_layers,
            backbone_dir=str(Path(backbone_dir).resolve()) if backbone_dir else "",
            max_position_embeddings=int(getattr(backbone.config, "max_position_embeddings", 0) or 0),
            bridge=bridge.config, freeze_upper=freeze_upper,
        )
        return cls(config, bridge, slicing.build_upper(backbone, layer), slicing.position_table(backbone), tokenizer,
                   json.loads(backbone.config.to_json_string()))

    def set_upper_trainable(self, trainable: bool) -> None:
        """Unfreeze (or freeze) the retained decoder layers and final norm; embeddings and head stay frozen."""
        for name, parameter in self.upper.named_parameters():
            frozen_always = "embed" in name or "wte" in name or "wpe" in name or "lm_head" in name
            parameter.requires_grad_(trainable and not frozen_always)
        self.config.freeze_upper = not trainable

    def check_backbone(self, backbone: nn.Module) -> None:
        """Raise ValueError unless ``backbone`` holds the weights this hybrid was cut from.

        Compares the retained part (embeddings, head, and the frozen layers and norm) tensor by tensor, so a
        checkpoint directory that was overwritten since the hybrid was trained is caught before it is used
        as a reference.
        """
        family = slicing.check_family(backbone.config)
        if backbone.config.num_hidden_layers != self.config.backbone_layers or family != self.config.family:
            raise ValueError(f"the backbone is a {backbone.config.num_hidden_layers}-layer {family}, this hybrid was cut "
                             f"from a {self.config.backbone_layers}-layer {self.config.family} ({self.config.backbone_dir})")
        expected = slicing.upper_state_dict(backbone.state_dict(), self.config.layer, family)
        trained = {name for name, p in self.upper.named_parameters() if p.requires_grad}
        for name, value in self.upper.state_dict().items():
            if name in trained:
                continue
            other = expected.get(name)
            if other is None or other.shape != value.shape or not torch.equal(other.to(value), value):
                raise ValueError(f"the backbone's {name} differs from the one this hybrid was cut from "
                                 f"({self.config.backbone_dir}); was that checkpoint replaced after training?")

    def train(self, mode: bool = True) -> HybridLM:
        """Train mode for the bridge only: the retained layers keep eval behaviour (no dropout), as the teacher."""
        super().train(mode)
        self.upper.eval()
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
            raise ValueError(f"attention_mask must have shape {(batch, past + length)} (cached + new tokens), got {tuple(attention_mask.shape)}")
        return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]

    def new_cache(self, seed: int | None = None) -> HybridCache:
        """An empty cache for incremental decoding; ``seed`` fixes the bridge's noise (else drawn from torch's RNG)."""
        return HybridCache(BridgeCache(self.bridge.config.context_layers), _new_upper_cache(self.upper.config), _resolve_seed(seed))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *, cache: HybridCache | None = None,
                nfe: int | None = None, sampler: str | None = None, seed: int | None = None,
                hidden_state_oracle: Tensor | None = None) -> HybridOutput:
        """Logits for ``input_ids`` ``(B, T)`` (continuing ``cache`` when given).

        The bridge samples ``h_l`` with ``nfe`` evaluations of ``sampler`` (config defaults) from noise
        fixed by ``seed`` (or the cache's seed; else drawn from torch's global RNG, so the output is
        deterministic under ``torch.manual_seed``). ``hidden_state_oracle`` ``(B, T, D)`` skips the bridge
        and decodes the given hidden state (the true ``h_l`` reproduces the backbone's logits).
        """
        past = cache.length if cache is not None else 0
        positions = self.positions(input_ids, attention_mask, past)
        if hidden_state_oracle is None:
            seed = cache.seed if cache is not None else _resolve_seed(seed)
            context = self.bridge.encode(self.condition(input_ids, positions), positions, attention_mask,
                                         cache.bridge if cache is not None else None)
            steps = nfe or self.bridge.config.nfe
            noise = position_noise(seed, positions, steps, self.bridge.config.hidden_size)
            hidden = self.bridge.denormalize(self.bridge.sample(context, noise.to(positions.device), steps, sampler,
                                                               cache.bridge if cache is not None else None))
        else:
            hidden = hidden_state_oracle
            if cache is not None:  # keep the bridge cache in step with the retained layers
                self.bridge.encode(self.condition(input_ids, positions), positions, attention_mask, cache.bridge)
        logits = self.decode(hidden, attention_mask, positions, cache.upper if cache is not None else None)
        return HybridOutput(logits=logits, hidden_state=hidden, cache=cache)

    def decode(self, hidden: Tensor, attention_mask: Tensor | None, positions: Tensor, upper_cache=None) -> Tensor:
        """Logits ``(B, T, V)`` of the retained layers + norm + head applied to hidden state ``h_l``."""
        dtype = next(self.upper.parameters()).dtype
        kwargs = {self._cache_keyword: upper_cache, "use_cache": upper_cache is not None}
        out = self.upper(inputs_embeds=hidden.to(dtype), attention_mask=attention_mask, position_ids=positions, **kwargs)
        return out.logits

    def generate(self, input_ids: Tensor, max_new_tokens: int, **kwargs):
        """See :func:`dihal_fast.hybrid.generation.generate`."""
        from dihal_fast.hybrid.generation import generate

        return generate(self, input_ids, max_new_tokens, **kwargs)

    # ----------------------------------------------------------------- persistence
    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write the self-contained hybrid directory (see the module docstring)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().float().contiguous().cpu() for k, v in self.bridge.state_dict().items()}
        if self.condition_position_table is not None:
            tensors.update({_TABLE_PREFIX + k: v.detach().contiguous().cpu() for k, v in self.condition_position_table.state_dict().items()})
        save_file(tensors, str(directory / "bridge.safetensors"))
        self.upper.save_pretrained(directory / "upper")
        atomic_write_json(directory / "backbone_config.json", self.backbone_config)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(directory)
        atomic_write_json(directory / "hybrid_config.json", self.config.to_dict())
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, device: str = "cpu") -> HybridLM:
        """Load a directory written by :meth:`save_pretrained`; clear errors for missing or corrupt parts."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        directory = Path(directory)
        if not directory.is_dir():
            raise FileNotFoundError(f"hybrid directory does not exist: {directory}")
        config = HybridConfig.from_dict(read_json(directory / "hybrid_config.json", "hybrid config"))
        weights = directory / "bridge.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(f"hybrid directory {directory} lacks bridge.safetensors")
        try:
            tensors = load_file(str(weights))
            upper = AutoModelForCausalLM.from_pretrained(directory / "upper")
        except Exception as exc:  # safetensors / transformers raise many types for a damaged file
            raise ValueError(f"hybrid directory {directory} is corrupt: {type(exc).__name__}: {exc}") from None
        bridge = Bridge(config.bridge)
        table_state = {k[len(_TABLE_PREFIX):]: v for k, v in tensors.items() if k.startswith(_TABLE_PREFIX)}
        try:
            bridge.load_state_dict({k: v for k, v in tensors.items() if not k.startswith(_TABLE_PREFIX)})
        except RuntimeError as exc:
            raise ValueError(f"{weights} does not match its bridge config: {exc}") from None
        table = None
        if table_state:
            table = nn.Embedding(*table_state["weight"].shape)
            table.load_state_dict(table_state)
        tokenizer = None
        if (directory / "tokenizer_config.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(directory)
        backbone_config = read_json(directory / "backbone_config.json", "backbone config")
        return cls(config, bridge, upper.eval(), table, tokenizer, backbone_config).to(device).eval()


def _resolve_seed(seed: int | None) -> int:
    """``seed``, or one drawn from torch's global generator (deterministic under ``torch.manual_seed``)."""
    return int(seed) if seed is not None else int(torch.randint(0, 2**62, (1,)).item())

