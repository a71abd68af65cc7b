"""``HybridConfig``: the transformers config of a hybrid (``model_type = "dihal_hybrid"``), saved as ``config.json``.

Everything needed to rebuild the model lives here: the bridge's config (with the teacher's target statistics),
the retained part's own Hugging Face config, where the backbone was cut, and how the bridge's noise is drawn
when nobody passes a seed. The backbone's path and config are provenance only: nothing reads the backbone to
load or run a hybrid.
"""

from __future__ import annotations

import logging
import numbers
from dataclasses import field
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig

from dihal_fast._version import __version__
from dihal_fast.bridge import BridgeConfig
from dihal_fast.common.devices import BRIDGE_DTYPES
from dihal_fast.errors import DihalValueError

logger = logging.getLogger(__name__)

MODEL_TYPE = "dihal_hybrid"
FORMAT = "dihal_fast.hybrid/2"
REMOTE_MODULE = "dihal_hybrid"  # the .py file save_pretrained writes next to config.json (auto_map)
AUTO_MAP = {"AutoConfig": f"{REMOTE_MODULE}.HybridConfig", "AutoModelForCausalLM": f"{REMOTE_MODULE}.HybridLM"}
# The earlier layout (hybrid_config.json + bridge.safetensors + upper/): refused here, converted by hybrid.legacy.
LEGACY_MARKER = "hybrid_config.json"
MAX_NFE = 1000  # denoising steps: the DDPM schedule's usual 1000 at most (each step holds a (B, T, D) noise draw)
SEED_LIMIT = 2**63  # noise seeds are 0 <= seed < 2**63 (a torch.Generator seed)


def is_legacy(directory: Path) -> bool:
    """Whether ``directory`` holds a hybrid in the earlier layout (and no transformers ``config.json``)."""
    return (directory / LEGACY_MARKER).is_file() and not (directory / "config.json").is_file()


def check_not_legacy(directory: Path) -> None:
    """DihalValueError with the conversion command for a hybrid directory in the earlier layout."""
    if is_legacy(directory):
        raise DihalValueError(
            f"{directory} holds a hybrid in the layout of dihal_fast before the transformers model "
            f"(hybrid_config.json); convert it once with: python -m dihal_fast.hybrid.legacy {directory}"
        )


def release_series(version: str) -> str:
    """The part of a version that changes with an incompatible release: ``0.3`` for ``0.3.1``, ``1`` for ``1.2.0``."""
    parts = version.split(".")
    return ".".join(parts[:2]) if parts[0] == "0" else parts[0]


def check_seed(value: object, what: str) -> int:
    """``value`` as a noise seed: an int (not a bool) in ``0 .. 2**63 - 1``; one line naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value < SEED_LIMIT:
        raise DihalValueError(f"{what} must be an integer in 0..2**63-1, got {value!r}")
    return int(value)


def check_nfe(value: object, what: str = "nfe") -> int:
    """``value`` as a number of denoising steps: an int (not a bool) in ``1 .. MAX_NFE``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= MAX_NFE:
        raise DihalValueError(f"{what} (denoising steps) must be an integer in 1..{MAX_NFE}, got {value!r}")
    return int(value)


def check_bridge_dtype(value: object, what: str = "bridge_dtype") -> str:
    """``value`` as a bridge dtype (one of :data:`BRIDGE_DTYPES`); one line naming ``what`` otherwise."""
    if value not in BRIDGE_DTYPES:
        raise DihalValueError(f"{what} must be one of {', '.join(BRIDGE_DTYPES)}, got {value!r}")
    return str(value)


_ALIASES = {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head"}  # GPT-2's names in its config.json


def _upper_value(upper: dict, name: str) -> object:
    """A field of the retained part's config dict, under its usual name or its GPT-2 alias."""
    return upper.get(name, upper.get(_ALIASES.get(name, name)))


class HybridConfig(PretrainedConfig):
    """Where the hybrid was cut and from what; ``bridge`` and ``upper`` are the sub-models' configs as dicts.

    ``noise_seed`` / ``stochastic_noise`` define the bridge's noise when a forward pass gets no ``seed``: by
    default (``stochastic_noise = False``) every position ``p`` uses the fixed draw ``position_noise(noise_seed,
    p)``, the same for every row, so a text always gets the same logits (scoring is deterministic, and equal
    under batching, padding and incremental decoding); with ``stochastic_noise = True`` each call draws a fresh
    seed from torch's global generator (one noise draw per row), the bridge as a sampler of ``h_l``.

    ``bridge_dtype`` (one of :data:`BRIDGE_DTYPES`): ``auto`` (default) gives the bridge the retained part's dtype
    (float32 beside float16); ``float32`` keeps it float32 whatever the load dtype (``from_pretrained(DIR,
    dtype=torch.bfloat16, bridge_dtype="float32")``, lm-eval's ``model_args=...,bridge_dtype=float32``,
    ``--bridge-dtype float32``). A trained bridge in bf16 moved held-out NLL by -0.00001 nats (record
    ``bridge_dtype_quality``).
    """

    model_type = MODEL_TYPE
    checks_own_weights = True  # HybridLM.from_pretrained checks the stored weights part by part (hf_loading)

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
    bridge_dtype: str = "auto"
    format: str = FORMAT
    package_version: str = ""  # the dihal_fast that wrote the directory ("" before it was recorded)
    tie_word_embeddings: bool = False  # the retained part ties its own head, if its family does
    is_decoder: bool = True
    # The retained part's, mirrored for tools that read them from the top-level config (0 = take the retained part's).
    num_hidden_layers: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0

    def __post_init__(self, **kwargs) -> None:
        kwargs.pop("auto_map", None)
        super().__post_init__(**kwargs)
        self.auto_map = dict(AUTO_MAP)
        if self.format != FORMAT:
            raise DihalValueError(f"not a {FORMAT} config (format = {self.format!r})")
        self.check_fields()
        if self.package_version and release_series(self.package_version) != release_series(__version__):
            logger.warning(
                "this hybrid was written by dihal_fast %s; the installed dihal_fast %s runs it (another release "
                "series: compare their CHANGELOG entries)",
                self.package_version,
                __version__,
            )

    def check_fields(self) -> None:
        """Refuse (one line) fields out of their range or type, and a retained part that does not fit the cut:
        ``layer`` in ``1 .. backbone_layers - 1``, the retained part's ``num_hidden_layers`` equal to
        ``backbone_layers - layer``, seeds and ``nfe`` in range, flags booleans."""
        for name in ("freeze_upper", "learned_positions", "stochastic_noise"):
            if not isinstance(getattr(self, name), bool):
                raise DihalValueError(f"hybrid config {name} must be true or false, got {getattr(self, name)!r}")
        check_seed(self.noise_seed, "hybrid config noise_seed")
        check_bridge_dtype(self.bridge_dtype, "hybrid config bridge_dtype")
        total = self.backbone_layers
        if isinstance(total, bool) or not isinstance(total, int) or total < 2:
            raise DihalValueError(f"hybrid config backbone_layers must be an integer >= 2, got {total!r}")
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or not 1 <= self.layer <= total - 1:
            raise DihalValueError(
                f"hybrid config layer must be an integer in 1..{total - 1} (the backbone has {total} layers), "
                f"got {self.layer!r}"
            )
        if "nfe" in self.bridge:
            check_nfe(self.bridge["nfe"], "hybrid config bridge.nfe")
        if not self.upper:
            return
        retained = _upper_value(self.upper, "num_hidden_layers")
        if retained != total - self.layer:
            raise DihalValueError(
                f"hybrid config upper.num_hidden_layers is {retained!r}; a cut at layer {self.layer} of a "
                f"{total}-layer backbone retains {total - self.layer}"
            )
        for name in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
            own, mirrored = getattr(self, name), _upper_value(self.upper, name)
            if not own and isinstance(mirrored, int):
                setattr(self, name, mirrored)
            elif own and own != mirrored:
                raise DihalValueError(f"hybrid config {name} is {own!r}, its retained part's (upper) {mirrored!r}")

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
