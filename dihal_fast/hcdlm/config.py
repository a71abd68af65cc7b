"""Configuration dataclasses of an HC-DLM run, saved as JSON next to every checkpoint."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field, fields
from typing import Any

from dihal_fast.common.devices import DEVICE_HELP, device_option
from dihal_fast.common.options import option
from dihal_fast.common.validation import CheckedConfig, field_flag
from dihal_fast.errors import DihalValueError
from dihal_fast.tasks.registry import TaskConfig
from dihal_fast.tasks.sudoku_task import parse_box
from dihal_fast.train.settings import loop_option

MODEL_KINDS = ("hcdlm", "latent", "mdm", "ar", "ccdd")
KERNELS = ("uniform", "absorbing")
LOGVAR_BOUNDS = ("soft", "clamp")
LATENT_LAYOUTS = ("pooled", "cells")
LATENT_UPDATES = ("ddim", "renoise")
REMASKS = ("auto", "random", "confidence")
VERIFIERS = ("chain", "rules")
REMOVED_VERIFIERS = {
    "final": "it scored an answer by the model's own reading of it, and HC-DLM's (the answer re-encoded) rates any "
    "sequence highly"
}


@dataclass
class HCDLMModelConfig(CheckedConfig):
    """Architecture. Baselines use ``hidden``/``heads`` and as many blocks as fit the HC-DLM budget."""

    # What a saved config without these (newer) fields meant, so that older runs load and resume as trained.
    legacy = {
        "slot_head": False,
        "logvar_bound": "clamp",
        "logvar_min": -10.0,
        "latent_schedule_power": 1.0,
        "slot_readout": True,
        "self_condition": False,
        "latent_layout": "pooled",
        "scaffold_floor": 0.0,
    }

    kind: str = option(
        "hcdlm",
        "hcdlm, mdm (masked diffusion), latent (Latent DM: no token scaffold), ar, or ccdd (CCDD: a masked "
        "token chain and a token-embedding chain denoised together; --kernel applies to hcdlm only)",
        flag="--model",
        choices=MODEL_KINDS,
    )
    hidden: int = option(64, "transformer width of every module", min=1)
    heads: int = option(4, "attention heads", min=1)
    # The solving is the denoiser's: at width 64 the encoder reconstructs 100 % within a few hundred steps.
    encoder_blocks: int = option(1, "blocks of the encoder q(x0|k0)", min=1)
    denoiser_blocks: int = option(
        6,
        "DiT blocks of the denoiser; the command line's default is 12 for 9x9 Sudoku (--sudoku-box 3x3), 6 otherwise",
        min=1,
        cli_default=None,
    )
    predictor_blocks: int = option(1, "blocks of the token predictor p(k0|x0)", min=1)
    latents: int = option(1, "M, number of continuous latent vectors (the cells layout: one per target slot)", min=1)
    latent_layout: str = option(
        "pooled",
        "how the M latents meet the L target slots: 'pooled' (any M; the encoder writes every latent from all slots "
        "through one flat linear, the predictor reads them back the same way) or 'cells' (M = L, one latent per slot: "
        "the encoder writes latent i from slot i, the denoiser's latent token i carries slot i's position and given, "
        "the predictor reads slot i from latent i)",
        choices=LATENT_LAYOUTS,
    )
    latent_dim: int = option(
        64,
        "d, size of each latent vector; the command line's default is 256 for 9x9 Sudoku (--sudoku-box 3x3), "
        "64 otherwise (a baseline's parameter count matches the HC-DLM of this width)",
        min=1,
        cli_default=None,
    )
    kernel: str = option("uniform", "discrete forward kernel of the token scaffold", choices=KERNELS)
    logvar_bound: str = option(
        "soft",
        "how the encoder's log-variance is kept in [--logvar-min, 0]: 'soft' (a scaled tanh, "
        "a gradient everywhere; ours) or 'clamp' (a hard clamp, zero gradient outside; the old "
        "behaviour, where sigma settled at the floor)",
        choices=LOGVAR_BOUNDS,
    )
    logvar_min: float = option(
        -10.0, "lower bound of the encoder's log-variance (sigma >= exp(logvar_min / 2))", min=-30.0, lt=0.0
    )
    # With one level for both, the re-noised scaffold holds what x_t holds, and the denoiser reads the
    # tokens (x_t -> noise moved the 9x9 read-out by <= 1.6 points).
    latent_schedule_power: float = option(
        1.0,
        "the latent's noise level is s ** p at the scaffold's level s: p > 1 keeps the latent less noisy than "
        "the scaffold at every step, so x_t holds what the re-noised scaffold dropped (ours; 1 = the paper's "
        "one level for both); the command line's default is 3 for 9x9 Sudoku (--sudoku-box 3x3), 1 otherwise",
        gt=0.0,
        cli_default=None,
    )
    scaffold_floor: float = option(
        0.0,
        "the scaffold's noise level is f + (1 - f) s at level s: f > 0 keeps at least a share f of the scaffold "
        "re-noised at every step, the last included, so the answer cannot be copied from the scaffold and must be "
        "carried by the latent (ours; 0 = the paper's)",
        min=0.0,
        lt=1.0,
    )
    dropout: float = option(0.0, "dropout rate", min=0.0, lt=1.0)
    baseline_blocks: int = option(0, "blocks of MDM/AR/CCDD (0 = match the HC-DLM parameter count)", min=0)
    slot_head: bool = option(
        True,
        "a training-only per-slot token head on the denoiser, needed by --slot-aux-weight "
        "(not in the paper); the command line's default is on exactly when --slot-aux-weight > 0",
        cli_default=None,
    )
    slot_readout: bool = option(
        True,
        "the denoiser adds a read-out of its slot states to x_hat_0, a path from the scaffold to x_hat_0 around the "
        "latent (not in the paper, whose x_hat_0 is the latent tokens' output only; off = the paper's)",
    )
    self_condition: bool = option(
        False,
        "latent self-conditioning: the denoiser also reads its own previous x_hat_0 (the last sampling step's; in "
        "training, for half the batches, a no-grad first pass's), so the latent path can carry its estimate from "
        "step to step (Chen et al. 2022; not in the paper; off = the paper's)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hidden % self.heads:
            raise DihalValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")


TOKEN_WEIGHTINGS = ("auto", "all", "schedule")
CONT_WEIGHTINGS = ("none", "min_snr")


@dataclass
class ObjectiveConfig(CheckedConfig):
    """Weights of the HC-DLM objective and the choices around it.

    The paper's (Proposition 1 and its Eqs. 25-27): ``lambda_recon``, ``lambda_ent`` (on the summed
    Gaussian log-density), ``lambda_cont``, the per-step token term ``-log p(k0 | x_hat_0(x_t, k_t, t))``
    read by the one time-invariant head, the 15 %-mask auxiliary on masked positions, the scaffold
    dropout for guidance, "all" token weighting for the uniform kernel and "schedule" for the absorbing one
    (``token_weighting="auto"``). Ours (departures, each an option): ``lambda_token``'s value, the
    ``min_snr`` form of the continuous weight ``omega_t`` (the paper names omega_t without a closed form
    here), ``detach_latents``, the exposure-robust share ``exposure_share`` with its ramp
    ``exposure_ramp_steps``, and dropping scaffolds only when ``guidance_training`` is on (the paper
    always drops them).
    """

    legacy = {  # the objective before these fields existed (see HCDLMModelConfig.legacy)
        "lambda_token": 0.0,
        "exposure_share": 0.0,
        "slot_aux_weight": 0.0,
        "guidance_training": True,
        "exposure_ramp_steps": 0,
        "scaffold_blind": 0.0,
    }

    lambda_recon: float = option(1.0, "weight of the token reconstruction CE", min=0.0)
    lambda_ent: float = option(8e-3, "weight of the encoder's E[log q] (entropy regulariser)", min=0.0)
    lambda_cont: float = option(0.5, "weight of the latent x0-regression", min=0.0)
    lambda_token: float = option(
        1.0,
        "weight of the per-step token term -log p(k0 | x_hat_0(x_t, k_t, t)), trained "
        "through denoiser and predictor (0 = off)",
        min=0.0,
    )
    token_weighting: str = option(
        "auto",
        "per-step token term: 'all' positions (mean CE, the uniform kernel's bound), "
        "'schedule' (corrupted positions weighted by 1/s, the masked-diffusion ELBO) or 'auto' "
        "(the paper's: all for the uniform kernel, schedule for absorbing)",
        choices=TOKEN_WEIGHTINGS,
    )
    cont_weighting: str = option(
        "none",
        "omega_t of the latent regression: 'none' (1) or 'min_snr' (min(SNR, 5) / 5, SNR = ((1-s)/s)^2)",
        choices=CONT_WEIGHTINGS,
    )
    mask_aux_weight: float = option(
        0.2,
        "weight of the auxiliary CE that encodes k0 with --mask-aux-rate of its tokens "
        "set to [MASK] and scores the masked positions (0 = off)",
        min=0.0,
    )
    mask_aux_rate: float = option(0.15, "share of tokens masked in the auxiliary term, in [0, 1]", min=0.0, max=1.0)
    guidance_training: bool = option(
        False,
        "train the unconditional branch of classifier-free guidance: a share "
        "--scaffold-drop of scaffolds replaced by random tokens; needed by --cfg-weight at "
        "sampling (the paper always drops; off = no drop, ours)",
    )
    scaffold_drop: float = option(
        0.2, "with --guidance-training: share of scaffolds replaced by random tokens", min=0.0, max=1.0
    )
    timesteps: int = option(1000, "T, number of noise levels; one t ~ U{1..T} per example, s = t / T", min=1)
    # Without detached latents, small CPU runs collapse the latents to a constant (regression -> 0,
    # reconstruction stuck at copying the givens).
    detach_latents: bool = option(True, "stop the latent regression's gradient into the encoder")
    # 0.5, not 1.0 (6x6 validation, 5 CPU-minutes: 63.3 / 34.0 % of easy / hard boards, 54.7 / 36.0 % at 1.0,
    # 44.0 / 20.7 % with all the old defaults; on 9x9 1.0 made "ignore the inputs" a stable optimum):
    # bench/results/hcdlm_defaults.json
    exposure_share: float = option(
        0.5,
        "share of each batch whose x_t and scaffold are built from the model's own "
        "no-grad prediction at a higher noise level (not in the paper; 0 = the paper's training)",
        min=0.0,
        max=1.0,
    )
    exposure_ramp_steps: int = option(
        0,
        "steps over which the exposure share rises linearly from 0 to --exposure-share "
        "(0 = constant from the first step; ours)",
        min=0,
    )
    # Trains the scaffold -> x_hat_0 path, which a denoiser that can copy x_t's signal otherwise never learns.
    latent_drop: float = option(
        0.0,
        "share of examples whose x_t carries no signal (pure noise, level s kept; not in the paper; 0 = off)",
        min=0.0,
        max=1.0,
    )
    # The mirror of latent_drop: these rows can only be solved from x_t, so the latent must carry the answer.
    scaffold_blind: float = option(
        0.0,
        "share of examples whose scaffold is all [MASK] (x_t kept; scored at level 1 like a dropped scaffold), so "
        "the denoiser must decode from the latent alone (not in the paper; 0 = off)",
        min=0.0,
        max=1.0,
    )
    # A direct signal per cell, where the token term reaches the slots only through the M x d latent.
    slot_aux_weight: float = option(
        1.0,
        "weight of a training-only CE of a per-slot token head on the denoiser's slot "
        "states (deep supervision, not in the paper; 0 = no head, the paper's model)",
        min=0.0,
    )

    def token_weighting_for(self, kernel: str) -> str:
        """The token term's weighting for this scaffold kernel ('auto' resolved to the paper's choice)."""
        if self.token_weighting != "auto":
            return self.token_weighting
        return "schedule" if kernel == "absorbing" else "all"

    def exposure_at(self, step: int) -> float:
        """The exposure share at optimizer step ``step`` (0-based): ramped linearly, then constant."""
        if not self.exposure_ramp_steps:
            return self.exposure_share
        return self.exposure_share * min(1.0, step / self.exposure_ramp_steps)


@dataclass
class HCDLMTrainConfig(CheckedConfig):
    """Optimisation and bookkeeping of an HC-DLM run (AdamW, linear warm-up, then a constant rate)."""

    renamed = {"ema": "ema_decay"}  # keys saved under an earlier name

    steps: int = loop_option("steps", 10000)
    batch_size: int = loop_option("batch_size", 64, "an example is one puzzle or text sequence")
    lr: float = loop_option(
        "lr",
        1e-3,
        "constant after the warm-up; the command line's default is 0.003 for 9x9 Sudoku (--sudoku-box 3x3), "
        "0.001 otherwise",
        cli_default=None,
    )
    weight_decay: float = loop_option("weight_decay", 0.0)
    warmup_steps: int = loop_option("warmup_steps", 100)
    grad_clip: float = loop_option("grad_clip", 1.0)
    ema_decay: float = loop_option("ema_decay", 0.999, flag=("--ema-decay", "--ema"))
    seed: int = loop_option("seed", 0)
    max_minutes: float = loop_option("max_minutes", 0.0)
    budget_clock: str = loop_option("budget_clock", "wall")
    log_every: int = loop_option("log_every", 25)
    checkpoint_every: int = loop_option("checkpoint_every", 250)
    threads: int = option(0, "torch CPU threads (0 = torch default)")
    device: str = device_option(help=DEVICE_HELP + "; a run resumes on the device type it started on")


@dataclass
class SampleConfig(CheckedConfig):
    """How to generate: steps for diffusion models, guidance, re-masking, MDM order, temperature."""

    steps: int = option(50, "sampling steps (diffusion models)", min=1)
    cfg_weight: float = option(0.0, "classifier-free guidance weight on the scaffold (0 = off; paper 2.75)", min=0.0)
    remask: str = option(
        "auto",
        "HC-DLM: which scaffold tokens are re-noised each step: random (each with prob. s), "
        "confidence (the round(s L) least confident), auto (the paper's: random for the uniform kernel, "
        "confidence for absorbing)",
        choices=REMASKS,
    )
    order: str = option(
        "margin", "MDM unmasking order: top-probability or top-probability margin", choices=("prob", "margin")
    )
    temperature: float | None = option(
        0.0,
        "token sampling temperature, float64 (0 = argmax; None = the run's task default, 0 for puzzles and 1 for "
        "text, resolved by ReadoutConfig.sampling); the command line's default is None",
        cli_default=None,
        min=0.0,
    )
    batch_size: int = option(128, "examples per sampling batch", min=1)
    clamp: bool = option(
        False, "HC-DLM: replace x_hat_0 at every step by the encoder mean of its argmax tokens (not in the paper)"
    )
    latent_update: str = option(
        "ddim",
        "HC-DLM / Latent DM: how the latent moves to the next level: 'ddim' (x_hat_0 plus the current noise, scaled: "
        "the paper's deterministic step) or 'renoise' (x_hat_0 noised afresh to the next level, as the exposure "
        "training builds x_t from the model's own estimate; ours)",
        choices=LATENT_UPDATES,
    )
    # Ours (test-time scaling): every kind's best-of-K under one protocol: bench/results/hcdlm_protocol6.json.
    best_of: int = option(
        1,
        "chains per problem; the answer is the chain --verifier scores highest; costs best_of times the sampling "
        "(ours; 1 = one chain, the paper's). 'dihal hcdlm eval' reports one chain, best-of-K and oracle@K side by "
        "side; eval and solve draw chains that would all be the same at argmax from their kind's default "
        "diversity source (MDM: reveal-order noise, AR: temperature; dihal_fast.hcdlm.protocol.DIVERSITY)",
        min=1,
    )
    # No argparse choices: a removed verifier is refused by __post_init__ with its reason, in one line.
    verifier: str = option(
        "chain",
        "how best-of-K scores its chains, the same for every kind: 'chain' (the log-probability the sampler gave "
        "each token as it committed it; checks nothing) or 'rules' (the task's rules: Sudoku rows, columns, boxes "
        "and givens; Countdown well-formed steps, the given numbers, the distance to the target; "
        "dihal_fast.hcdlm.rules)",
        metavar="{" + ",".join(VERIFIERS) + "}",
    )
    givens: bool = option(
        False,
        "MDM / CCDD on Sudoku: start the token chain with the given digits in place (as a user would) and reveal "
        "only the blanks on the step schedule; off = every cell starts [MASK]",
    )
    reveal_noise: float = option(
        0.0,
        "MDM / CCDD: Gumbel noise of this scale added to each slot's confidence before the reveals are chosen, "
        "so argmax chains differ (a diversity source for --best-of; 0 = the exact confidence order)",
        min=0.0,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.verifier in REMOVED_VERIFIERS:
            raise DihalValueError(
                f"--verifier {self.verifier} was removed: {REMOVED_VERIFIERS[self.verifier]}; use --verifier rules "
                "(the task's rules, every kind) or --verifier chain"
            )
        if self.verifier not in VERIFIERS:
            raise DihalValueError(f"--verifier must be one of {', '.join(VERIFIERS)}; got {self.verifier!r}")


# 9x9 Sudoku's own defaults (the command line's; the fields keep theirs, so a saved config means what it says),
# chosen while test-split results were visible. The learning rate of every 9x9 record (not searched at 9x9); a
# latent width at which sigma settles at 0.25 instead of the floor and a latent kept less noisy than the scaffold
# (bench/results/hcdlm_defaults9.json); with a 6-block denoiser two training seeds of four solved >= 20 % of easy
# boards in 30 CPU-minutes with --best-of 8, with 12 blocks all five did (hcdlm_sudoku9.json, seeds as rows).
SUDOKU9_DEFAULTS: dict[str, float] = {
    "latent_dim": 256,
    "latent_schedule_power": 3.0,
    "lr": 3e-3,
    "denoiser_blocks": 12,
}


def task_defaults(task: str, sudoku_box: str) -> dict[str, float]:
    """The defaults of ``latent_dim``, ``latent_schedule_power``, ``lr`` and ``denoiser_blocks`` for this task
    (field name -> value): 9x9 Sudoku's measured values, otherwise the fields' own."""
    if task == "sudoku" and parse_box(sudoku_box) == (3, 3):
        return dict(SUDOKU9_DEFAULTS)
    return {
        "latent_dim": HCDLMModelConfig.latent_dim,
        "latent_schedule_power": HCDLMModelConfig.latent_schedule_power,
        "lr": HCDLMTrainConfig.lr,
        "denoiser_blocks": HCDLMModelConfig.denoiser_blocks,
    }


# The run fields a kind never reads: its networks, loss and sampler are the same whatever their values (a baseline
# still reads the HC-DLM architecture fields, which size the parameter budget it matches). Tested both ways.
_LATENT_FIELDS = ("logvar_bound", "logvar_min", "latent_schedule_power")
_SCAFFOLD_FIELDS = (
    "kernel",
    "scaffold_floor",
    "token_weighting",
    "guidance_training",
    "scaffold_drop",
    "scaffold_blind",
)
_CCDD_OBJECTIVE = ("timesteps", "lambda_cont", "cont_weighting")
UNREAD_FIELDS: dict[str, tuple[str, ...]] = {
    "hcdlm": (),
    "latent": _SCAFFOLD_FIELDS,
    **{
        kind: (
            *_LATENT_FIELDS,
            "kernel",
            "scaffold_floor",
            *(f.name for f in fields(ObjectiveConfig) if f.name not in reads),
        )
        for kind, reads in (("mdm", ()), ("ar", ()), ("ccdd", _CCDD_OBJECTIVE))
    },
}


def flag_text(owner: type, name: str, value: Any) -> str:
    """Field ``name`` of dataclass ``owner`` at ``value``, as the flag that gives it: ``--kernel absorbing``,
    ``--guidance-training`` / ``--no-guidance-training``."""
    flag = field_flag(name, owner.__dataclass_fields__[name].metadata)
    return (flag if value else "--no-" + flag[2:]) if isinstance(value, bool) else f"{flag} {value}"


def check_read_fields(values: Mapping[str, Any]) -> None:
    """Refuse, in one line, the flat run fields (name -> value) given for a kind that never reads them
    (:data:`UNREAD_FIELDS`): a field counts as given when its value is neither None nor the field's default."""
    kind = values.get("kind", HCDLMModelConfig.kind)
    owners = {f.name: section for section in (HCDLMModelConfig, ObjectiveConfig) for f in fields(section)}
    given = [
        name
        for name in UNREAD_FIELDS.get(kind, ())
        if values.get(name) not in (None, owners[name].__dataclass_fields__[name].default)
    ]
    if given:
        flags = ", ".join(flag_text(owners[name], name, values[name]) for name in given)
        raise DihalValueError(f"--model {kind} never reads {flags}: these are options of other kinds; leave them out")


def fill_task_defaults(values: MutableMapping[str, Any]) -> None:
    """Fill in, in place, the flat run fields (name -> value, None = not given) whose default depends on others:
    :func:`task_defaults` of ``name`` / ``sudoku_box``; ``text_files`` (the shipped corpus) and ``tokenizer_dir``
    (the shipped backbone) for the text task, empty otherwise; ``slot_head`` on exactly when ``slot_aux_weight`` > 0.
    Given values are kept. ``dihal hcdlm train`` and :meth:`RunConfig.for_task` both go through here."""
    from dihal_fast.common.assets import default_corpus, default_model_dir

    task = values.get("name", TaskConfig.name)
    for name, value in task_defaults(task, values.get("sudoku_box", TaskConfig.sudoku_box)).items():
        if values.get(name) is None:
            values[name] = value
    text = task == "text"
    values["text_files"] = [str(f) for f in values.get("text_files") or []] or ([str(default_corpus())] if text else [])
    tokenizer = values.get("tokenizer_dir")
    values["tokenizer_dir"] = str(tokenizer or default_model_dir()) if text else ""
    if values.get("slot_head") is None:
        values["slot_head"] = values.get("slot_aux_weight", ObjectiveConfig.slot_aux_weight) > 0


@dataclass
class RunConfig(CheckedConfig):
    """Everything that determines an HC-DLM run, saved as ``config.json`` in the run and in every checkpoint
    (sections read back with their own ``renamed`` / ``legacy`` history, :mod:`dihal_fast.common.serial`)."""

    task: TaskConfig = field(default_factory=TaskConfig)
    model: HCDLMModelConfig = field(default_factory=HCDLMModelConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    train: HCDLMTrainConfig = field(default_factory=HCDLMTrainConfig)

    @classmethod
    def for_task(cls, **values: Any) -> RunConfig:
        """The run ``dihal hcdlm train`` builds from these flat fields (``name="sudoku", sudoku_box="3x3",
        steps=2000, ...``, each the field name of its section), every task-dependent default filled in as the
        command line fills it (:func:`fill_task_defaults`); an unknown name, or a field the kind never reads
        (:func:`check_read_fields`), is refused."""
        sections = {
            "task": TaskConfig,
            "model": HCDLMModelConfig,
            "objective": ObjectiveConfig,
            "train": HCDLMTrainConfig,
        }
        owner = {f.name: section for section, kind in sections.items() for f in fields(kind)}
        unknown = sorted(set(values) - set(owner))
        if unknown:
            raise DihalValueError(f"RunConfig.for_task: unknown field(s) {unknown}; fields: {sorted(owner)}")
        check_read_fields(values)
        values = dict(values)
        fill_task_defaults(values)
        split: dict[str, dict[str, Any]] = {section: {} for section in sections}
        for name, value in values.items():
            split[owner[name]][name] = value
        return cls(**{section: sections[section](**split[section]) for section in sections})
