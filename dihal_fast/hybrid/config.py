"""``HybridConfig``: the transformers config of a hybrid (``model_type = "dihal_hybrid"``), saved as ``config.json``.

Everything needed to rebuild the model lives here: the bridge's config (with the teacher's target statistics),
the retained part's own Hugging Face config, where the backbone was cut, and how the bridge's noise is drawn
when nobody passes a seed. The backbone's path and config are provenance only: nothing reads the backbone to
load or run a hybrid.
"""

from __future__ import annotations

from dataclasses import field

from transformers import AutoConfig, PretrainedConfig

from dihal_fast.bridge import BridgeConfig
from dihal_fast.errors import DihalValueError

MODEL_TYPE = "dihal_hybrid"
FORMAT = "dihal_fast.hybrid/2"  # /1 was the hybrid_config.json + bridge.safetensors + upper/ layout
REMOTE_MODULE = "dihal_hybrid"  # the .py file save_pretrained writes next to config.json (auto_map)
AUTO_MAP = {"AutoConfig": f"{REMOTE_MODULE}.HybridConfig", "AutoModelForCausalLM": f"{REMOTE_MODULE}.HybridLM"}


class HybridConfig(PretrainedConfig):
    """Where the hybrid was cut and from what; ``bridge`` and ``upper`` are the sub-models' configs as dicts.

    ``noise_seed`` / ``stochastic_noise`` define the bridge's noise when a forward pass gets no ``seed``: by
    default (``stochastic_noise = False``) every position ``p`` uses the fixed draw ``position_noise(noise_seed,
    p)``, the same for every row, so a text always gets the same logits (scoring is deterministic, and equal
    under batching, padding and incremental decoding); with ``stochastic_noise = True`` each call draws a fresh
    seed from torch's global generator (one noise draw per row), the bridge as a sampler of ``h_l``.
    """

    model_type = MODEL_TYPE

    family: str = ""
    layer: int = 1
    backbone_layers: int = 2
    max_position_embeddings: int = 0
    vocab_size: int = 0
    hidden_size: int = 0
    bridge: dict = field(default_factory=dict)
    upper: dict = field(default_factory=dict)
    backbone_dir: str = ""  # provenance: the checkpoint directory the hybrid was cut from
    backbone_config: dict = field(default_factory=dict)  # provenance: the full backbone's config
    freeze_upper: bool = True
    learned_positions: bool = False  # the backbone adds a learned position table to c(x) (GPT-2's wpe)
    noise_seed: int = 0
    stochastic_noise: bool = False
    format: str = FORMAT
    tie_word_embeddings: bool = False  # the retained part ties its own head, if its family does
    is_decoder: bool = True

    def __post_init__(self, **kwargs) -> None:
        kwargs.pop("auto_map", None)
        super().__post_init__(**kwargs)
        self.auto_map = dict(AUTO_MAP)
        if self.format != FORMAT:
            raise DihalValueError(f"not a {FORMAT} config (format = {self.format!r})")

    @property
    def bridge_config(self) -> BridgeConfig:
        """The bridge's :class:`~dihal_fast.bridge.BridgeConfig`."""
        return BridgeConfig.from_dict(dict(self.bridge))

    def upper_model_config(self) -> PretrainedConfig:
        """The retained part's Hugging Face config (same family as the backbone, ``L - layer`` layers)."""
        data = dict(self.upper)
        model_type = data.pop("model_type", None)
        if not model_type:
            raise DihalValueError("hybrid config lacks the retained part's config (upper.model_type)")
        return AutoConfig.for_model(model_type, **data)

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoConfig") -> None:
        """No-op: ``save_pretrained`` writes the ``auto_map`` and its module itself (transformers would copy
        the package's source file instead)."""
