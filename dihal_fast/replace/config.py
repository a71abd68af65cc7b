"""BridgeTrainConfig: everything that determines a bridge training run (saved as JSON next to every checkpoint).

Each field carries its command-line help in ``metadata["help"]``; :mod:`dihal_fast.common.options` turns the
dataclass into ``dihal replace`` options (the bridge overrides as ``--bridge-*``), so the CLI and the Python API
cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dihal_fast.bridge import PREDICTIONS, SAMPLERS, SCHEDULES, BridgeConfig
from dihal_fast.common.devices import device_option, dtype_option
from dihal_fast.common.options import option
from dihal_fast.common.validation import CheckedConfig
from dihal_fast.errors import DihalValueError
from dihal_fast.train.settings import LoopSettings, loop_option

# Bridge options a user may set, as ``--bridge-*`` flags (the rest of BridgeConfig is derived from the backbone
# and the data): {BridgeConfig field: argparse settings}.
BRIDGE_OPTIONS: dict[str, dict] = {
    "width": {"help": "bridge width W (0 = the backbone's hidden size)"},
    "context_layers": {
        "help": "the bridge's own causal attention blocks in the context encoder (-1 = one per replaced layer "
        "not copied: l* - copied_layers)"
    },
    "heads": {"help": "attention heads of the context encoder (0 = W // 64)"},
    "mlp_ratio": {"help": "MLP expansion of context and denoiser blocks"},
    "unet_depth": {"help": "halvings of the width in the denoiser's down path (UNet levels - 1)"},
    "time_dim": {"help": "size of the sinusoidal time embedding"},
    "schedule": {"help": f"noise schedule: {', '.join(SCHEDULES)}", "choices": sorted(SCHEDULES)},
    "prediction": {"help": f"what the denoiser predicts: {', '.join(PREDICTIONS)}", "choices": list(PREDICTIONS)},
    "sampler": {
        "help": f"sampler used in training unrolls and by default at inference: {', '.join(SAMPLERS)}",
        "choices": sorted(SAMPLERS),
    },
    "nfe": {"help": "denoiser evaluations per token (training unroll and default inference)"},
}


# The width up to which a bridge trains at the full --lr; wider ones at lr x LR_WIDTH / W (AdamW's updates move each
# output by ~lr x fan-in: SmolLM2's 576-wide bridge diverged at 3e-3, the shipped backbones' 96-128-wide ones train).
LR_WIDTH = 128

COPIED_INITS = ("backbone", "random")
KD_DIVERGENCES = ("forward", "reverse")
TARGET_SCALINGS = ("auto", "scalar", "clipped")


@dataclass
class BridgeTrainConfig(CheckedConfig):
    """Data, optimisation, loss weights, bridge architecture and bookkeeping of one bridge training run."""

    renamed = {"save_every": "checkpoint_every"}  # keys saved under an earlier name (common.serial)
    # fields added since runs were saved, with the value those runs used
    legacy = {
        "grad_accum_steps": 1,
        "lm_every": 1,
        "max_minutes": 0.0,
        "budget_clock": "wall",
        "copied_layers": 0,
        "train_copied_layers": False,
        "copied_init": "backbone",
        "checkpoint_minutes": 0.0,
        "kd_divergence": "forward",
        "on_policy_every": 0,
        "on_policy_prefix": 32,
        "target_scaling": "scalar",
    }

    # data
    seq_len: int = option(128, "tokens per training block", min=2)
    batch_size: int = loop_option("batch_size", 8, "an example is a block of --seq-len tokens")
    grad_accum_steps: int = loop_option("grad_accum_steps", 1)
    val_blocks: int = option(
        32, "held-out blocks for validation (the corpus tail, or the first blocks of --val-corpus)", min=1
    )
    max_train_tokens: int = option(0, "read at most this many training tokens from the corpus (0 = all)")
    stats_blocks: int = option(
        64, "training blocks used for the teacher's mean/std of h_l (target normalisation)", min=1
    )
    # optimisation
    steps: int = loop_option("steps", 300)
    lr: float = loop_option(
        "lr",
        3e-3,
        f"of a bridge up to {LR_WIDTH} wide; a wider one trains at lr x {LR_WIDTH} / W (a real model's width "
        "diverges at the full rate); then a cosine to a tenth of it",
    )
    weight_decay: float = loop_option("weight_decay", 0.0)
    warmup_steps: int = loop_option("warmup_steps", 20)
    grad_clip: float = loop_option("grad_clip", 1.0)
    ema_decay: float = loop_option("ema_decay", 0.999)
    max_minutes: float = loop_option("max_minutes", 0.0, "the run then ends early and exports what it trained")
    budget_clock: str = loop_option("budget_clock", "wall")
    # loss
    w_diff: float = option(1.0, "weight of the diffusion loss (MSE on the prediction target at a random t)", min=0.0)
    w_rec: float = option(1.0, "weight of the variance-normalised reconstruction MSE of the sampled h_l", min=0.0)
    w_lm: float = option(0.1, "weight of next-token cross-entropy through the retained layers", min=0.0)
    w_kd: float = option(1.0, "weight of KL(teacher || hybrid) of next-token distributions", min=0.0)
    lm_every: int = option(
        1,
        "optimizer steps per step with the next-token and distillation losses; the steps between train the "
        "diffusion and reconstruction losses alone, running the teacher only up to l* and no retained layer",
        min=1,
    )
    kd_temperature: float = option(1.0, "softmax temperature of the distillation loss (loss scaled by T^2)", gt=0.0)
    kd_divergence: str = option(
        "forward",
        "the distillation loss: forward KL(teacher || hybrid) covers the teacher's mass; reverse KL(hybrid || "
        "teacher) penalises the tokens the hybrid would draw that the teacher finds unlikely (what its samples' "
        "Gen PPL measures)",
        choices=KD_DIVERGENCES,
    )
    on_policy_every: int = option(
        0,
        "every n-th step with the distillation loss trains on the hybrid's own continuations: each block keeps its "
        "first --on-policy-prefix tokens and the rest is sampled from the hybrid being trained (temperature 1), "
        "the next-token loss left out on those steps (0 = never: teacher-forced on the corpus only)",
        min=0,
    )
    on_policy_prefix: int = option(32, "tokens of each block kept as the prompt of an on-policy step", min=1)
    # model
    copied_layers: int = option(
        -1,
        "backbone layers 1..k copied into the bridge's context encoder; the bridge learns layers k+1..l* and "
        "predicts x0 as the copies' h_k plus its correction (-1 = l* - 1: the diffusion bridge learns the last "
        "replaced layer; l*: it corrects the backbone's own h_l*; 0 = the paper's bridge, everything learned from "
        "c(x), as the sweep trains it)",
        min=-1,
    )
    train_copied_layers: bool = option(False, "train the copied backbone layers with the bridge (default: frozen)")
    copied_init: str = option(
        "backbone",
        "weights the copied layers start from: the backbone's, or random (the same architecture initialised as a "
        "fresh model of the family and trained with the bridge: the from-scratch control of what the copies' "
        "weights contribute; needs --train-copied-layers)",
        choices=COPIED_INITS,
    )
    target_scaling: str = option(
        "auto",
        "how the bridge's targets z = (h - mean) / std are scaled: scalar (one std, the root mean per-dimension "
        "variance: the layer's geometry kept), clipped (per dimension, max(std_d, the median dimension's std): "
        "a massive-activation dimension holds no more of the losses than any other) or auto (clipped when layers "
        "are copied, whose h_k carries the massive dimensions into the prediction; else scalar)",
        choices=TARGET_SCALINGS,
    )
    train_upper: bool = option(False, "also train the retained decoder layers and final norm (default: frozen)")
    dtype: str = dtype_option(
        help="dtype of the backbone (teacher) and retained layers: auto (the checkpoint's own), "
        "float32, bfloat16, float16 or float64; saved resolved"
    )
    bridge: dict = field(
        default_factory=dict,
        metadata={
            "help": "overrides of BridgeConfig options (--bridge-*)",
            "overrides": (BridgeConfig, BRIDGE_OPTIONS),
        },
    )
    # bookkeeping
    seed: int = loop_option("seed", 0)
    device: str = device_option(
        help="device for plain-torch training: auto (cuda when torch sees one), cpu, cuda, cuda:N "
        "(DeepSpeed uses cuda:LOCAL_RANK when CUDA is present)"
    )
    log_every: int = loop_option("log_every", 10)
    eval_every: int = option(0, "steps between validations (0 = only at the end)")
    checkpoint_every: int = loop_option("checkpoint_every", 100, flag=("--checkpoint-every", "--save-every"))
    checkpoint_minutes: float = loop_option("checkpoint_minutes", 5.0)
    keep_checkpoints: int = loop_option("keep_checkpoints", 2)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.w_diff + self.w_rec + self.w_lm + self.w_kd == 0:
            raise DihalValueError("all loss weights are 0: nothing to train")
        self.bridge_options(hidden_size=8, layer=max(1, self.copied_layers))  # checks the overrides
        if self.on_policy_every and (self.w_kd == 0 or self.on_policy_prefix >= self.seq_len):
            raise DihalValueError(
                f"--on-policy-every needs --w-kd > 0 (it distils on the hybrid's own samples) and --on-policy-prefix "
                f"below --seq-len, got --w-kd {self.w_kd:g}, --on-policy-prefix {self.on_policy_prefix}, --seq-len "
                f"{self.seq_len}"
            )
        if self.copied_init == "random" and not self.train_copied_layers:
            raise DihalValueError(
                "--copied-init random needs --train-copied-layers: frozen random layers would compute nothing useful"
            )

    def scaling_for(self, copied_layers: int) -> str:
        """The target scaling a bridge with ``copied_layers`` copied layers trains with (``auto`` resolved)."""
        if self.target_scaling != "auto":
            return self.target_scaling
        return "clipped" if copied_layers > 0 else "scalar"

    def loop_settings(self, device: str | None = None, width: int = LR_WIDTH) -> LoopSettings:
        """The shared loop's view of a bridge run of width ``width`` (its peak rate, then a cosine to a tenth)."""
        return LoopSettings.from_config(
            self, lr=self.lr * min(1.0, LR_WIDTH / width), lr_floor=0.1, device=device or self.device
        )

    def bridge_options(self, hidden_size: int, layer: int = 1) -> BridgeConfig:
        """The BridgeConfig these overrides give for a backbone of width ``hidden_size``."""
        allowed = set(BRIDGE_OPTIONS)
        unknown = sorted(set(self.bridge) - allowed)
        if unknown:
            raise DihalValueError(f"unknown bridge options {unknown}; expected a subset of {sorted(allowed)}")
        copied = {"copied_layers": layer - 1 if self.copied_layers == -1 else self.copied_layers}
        if self.train_copied_layers:
            copied["train_copied_layers"] = True
        return BridgeConfig(hidden_size=hidden_size, condition_size=hidden_size, layer=layer, **copied, **self.bridge)
