"""The one table of HC-DLM's model kinds: each kind (``HCDLMModelConfig.kind``) registers how it is built, trained,
sampled and traced step by step, and whether its chains are all the same at temperature 0.

The trainer, the samplers' front door (:func:`generate`), scoring, the mechanism diagnostics and the API look a kind
up here (:func:`kind_of`, :data:`KINDS`) instead of testing model classes, so adding a baseline is one entry.

A *verifier* scores finished answers so that best-of-K can pick one (``SampleConfig.verifier``), the same way for
every kind: ``"chain"`` is the log-probability the sampler itself gave its tokens (summed at each commit; it checks
nothing), ``"rules"`` the task's rules (:mod:`dihal_fast.hcdlm.rules`; no network pass).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dihal_fast.errors import DihalTypeError, DihalValueError
from dihal_fast.hcdlm.ccdd import CCDDNet, ccdd_loss, sample_ccdd
from dihal_fast.hcdlm.config import HCDLMModelConfig, ObjectiveConfig, SampleConfig, flag_text
from dihal_fast.hcdlm.layers import Block, count_parameters
from dihal_fast.hcdlm.networks import HCDLM, ARNet, MDMNet
from dihal_fast.hcdlm.objective import ar_loss, hcdlm_loss, mdm_loss
from dihal_fast.hcdlm.rules import rule_scores
from dihal_fast.hcdlm.sampler import sample_ar, sample_hcdlm, sample_mdm
from dihal_fast.tasks.base import Task, TaskSpec

REVEALING = ("mdm", "ccdd")  # kinds whose token chain reveals slots that then stay (SampleConfig.reveal_noise, givens)

Loss = Callable[..., tuple[torch.Tensor, dict[str, float]]]
Sampler = Callable[..., torch.Tensor]
Trace = Callable[..., list[torch.Tensor]]


def _whole(model: nn.Module) -> nn.Module:
    return model


def _denoiser(model: nn.Module) -> nn.Module:
    return model.denoiser


@dataclass(frozen=True)
class ModelKind:
    """One model kind: ``build(spec, cfg)``; ``loss(model, kernel, context, target, objective, generator)``;
    ``sample(model, kernel, context, cfg, generator, log_prob)`` (one chain per row, ``log_prob`` gains the chain
    score when given); ``trace(model, kernel, context, cfg, generator)`` (the decoded answer after every step, None:
    no steps); ``deterministic_at_t0`` (every chain the same at temperature 0 without reveal noise, so best-of-K
    there is refused); ``latent`` (an encoder / denoiser / predictor the mechanism probes can open); ``main`` (the
    module whose forward calls count as the kind's forward passes); ``unread_sample`` (the :class:`SampleConfig`
    fields its sampler never reads, refused by :func:`check_sample` when they differ from their defaults; every kind
    reads ``steps`` but AR, whose ``steps`` is let through so that one sampler config serves every kind)."""

    name: str
    build: Callable[[TaskSpec, HCDLMModelConfig], nn.Module]
    loss: Loss
    sample: Sampler
    trace: Trace | None = None
    deterministic_at_t0: bool = True
    latent: bool = False
    main: Callable[[nn.Module], nn.Module] = _whole
    unread_sample: tuple[str, ...] = ()


def matched_blocks(spec: TaskSpec, cfg: HCDLMModelConfig, kind: str) -> int:
    """Blocks a baseline needs to come closest to the HC-DLM parameter count (at least one)."""
    if cfg.baseline_blocks:
        return cfg.baseline_blocks
    budget = count_parameters(HCDLM(spec, cfg))
    net, cond_dim = {"ccdd": (CCDDNet, cfg.hidden), "mdm": (MDMNet, 0), "ar": (ARNet, 0)}[kind]
    base = count_parameters(net(spec, cfg, 0))
    one = count_parameters(Block(cfg.hidden, cfg.heads, cond_dim=cond_dim))
    return max(1, round((budget - base) / one))


PARAMETER_TOLERANCE = 0.10  # a baseline's parameter count may differ from its HC-DLM's by this share


def parameter_match(spec: TaskSpec, cfg: HCDLMModelConfig) -> dict[str, float | int | bool]:
    """``{parameters, hcdlm_parameters, ratio, matched}``: this kind's count against the HC-DLM of the same fields,
    ``matched`` when within :data:`PARAMETER_TOLERANCE` (a record prints both counts either way)."""
    count = count_parameters(build_model(spec, cfg))
    reference = count_parameters(HCDLM(spec, cfg))
    ratio = count / reference
    return {
        "parameters": count,
        "hcdlm_parameters": reference,
        "ratio": ratio,
        "matched": abs(ratio - 1) <= PARAMETER_TOLERANCE,
    }


def _baseline(net: type[nn.Module], kind: str) -> Callable[[TaskSpec, HCDLMModelConfig], nn.Module]:
    return lambda spec, cfg: net(spec, cfg, matched_blocks(spec, cfg, kind))


def _hcdlm_loss(model, kernel, context, target, objective: ObjectiveConfig, generator):
    return hcdlm_loss(model, kernel, context, target, objective, generator)


def _mdm_loss(model, kernel, context, target, objective: ObjectiveConfig, generator):
    return mdm_loss(model, context, target, generator)


def _ar_loss(model, kernel, context, target, objective: ObjectiveConfig, generator):
    return ar_loss(model, context, target, generator)


def _ccdd_loss(model, kernel, context, target, objective: ObjectiveConfig, generator):
    return ccdd_loss(model, context, target, objective, generator)


def _hcdlm_sample(model, kernel, context, cfg, generator, log_prob):
    return sample_hcdlm(model, kernel, context, cfg, generator, log_prob=log_prob)


def _mdm_sample(model, kernel, context, cfg, generator, log_prob):
    return sample_mdm(model, context, cfg, generator, log_prob=log_prob)


def _ar_sample(model, kernel, context, cfg, generator, log_prob):
    return sample_ar(model, context, cfg, generator, log_prob=log_prob)


def _ccdd_sample(model, kernel, context, cfg, generator, log_prob):
    return sample_ccdd(model, context, cfg, generator, log_prob=log_prob)


def _hcdlm_trace(model, kernel, context, cfg, generator) -> list[torch.Tensor]:
    steps: list[torch.Tensor] = []
    sample_hcdlm(model, kernel, context, cfg, generator, on_step=lambda *args: steps.append(args[-1]))
    return steps


def _reveal_trace(sampler: Sampler) -> Trace:
    def trace(model, kernel, context, cfg, generator) -> list[torch.Tensor]:
        steps: list[torch.Tensor] = []
        sampler(model, context, cfg, generator, on_step=lambda _, tokens: steps.append(tokens))
        return steps

    return trace


_NOT_REVEALING = ("order", "givens", "reveal_noise")  # MDM / CCDD's reveal order and start
_HCDLM_SAMPLE = ("cfg_weight", "remask", "clamp")  # HC-DLM's guidance, scaffold re-noising and latent clamp


def _latent_kind(name: str, scaffold: bool, unread_sample: tuple[str, ...]) -> ModelKind:
    return ModelKind(
        name,
        lambda spec, cfg: HCDLM(spec, cfg, scaffold=scaffold),
        _hcdlm_loss,
        _hcdlm_sample,
        trace=_hcdlm_trace,
        deterministic_at_t0=False,  # random x_T (and, with a scaffold, its random re-noising)
        latent=True,
        main=_denoiser,
        unread_sample=unread_sample,
    )


KINDS: dict[str, ModelKind] = {
    "hcdlm": _latent_kind("hcdlm", scaffold=True, unread_sample=_NOT_REVEALING),
    "latent": _latent_kind("latent", scaffold=False, unread_sample=("cfg_weight", "remask", *_NOT_REVEALING)),
    "mdm": ModelKind(
        "mdm",
        _baseline(MDMNet, "mdm"),
        _mdm_loss,
        _mdm_sample,
        _reveal_trace(sample_mdm),
        unread_sample=_HCDLM_SAMPLE,
    ),
    "ar": ModelKind(
        "ar",
        _baseline(ARNet, "ar"),
        _ar_loss,
        _ar_sample,
        unread_sample=(*_HCDLM_SAMPLE, *_NOT_REVEALING),
    ),
    "ccdd": ModelKind(
        "ccdd",
        _baseline(CCDDNet, "ccdd"),
        _ccdd_loss,
        _ccdd_sample,
        _reveal_trace(sample_ccdd),
        deterministic_at_t0=False,  # random z_1
        unread_sample=_HCDLM_SAMPLE,
    ),
}


def build_model(spec: TaskSpec, cfg: HCDLMModelConfig) -> nn.Module:
    """The network of ``cfg.kind`` for this task (its ``kind`` attribute names its entry)."""
    if cfg.kind not in KINDS:
        raise DihalValueError(f"model kind must be one of {sorted(KINDS)}, got {cfg.kind!r}")
    return KINDS[cfg.kind].build(spec, cfg)


def kind_of(model: nn.Module) -> ModelKind:
    """The table entry of one of the kinds' networks (by its ``kind`` attribute)."""
    name = getattr(model, "kind", None)
    if name not in KINDS:
        raise DihalTypeError(f"no model kind for {type(model).__name__}")
    return KINDS[name]


_DEFAULT_SAMPLE = SampleConfig()


def check_sample(model: nn.Module, cfg: SampleConfig) -> None:
    """Refuse sampler options this kind never reads (:attr:`ModelKind.unread_sample`), and best-of-K where every
    chain would be the same (a kind deterministic at temperature 0, sampled at temperature 0 without reveal-order
    noise)."""
    kind = kind_of(model)
    given = [name for name in kind.unread_sample if getattr(cfg, name) != getattr(_DEFAULT_SAMPLE, name)]
    if given:
        flags = ", ".join(flag_text(SampleConfig, name, getattr(cfg, name)) for name in given)
        raise DihalValueError(f"the {kind.name} sampler never reads {flags}: these are other kinds' options")
    if cfg.best_of > 1 and cfg.temperature == 0 and kind.deterministic_at_t0 and not cfg.reveal_noise:
        raise DihalValueError(
            f"--best-of {cfg.best_of} needs chains that differ, and {type(model).__name__} at temperature 0 gives "
            "the same one every time: set --temperature > 0, --reveal-noise > 0 (MDM) or --best-of 1"
        )


def sample_chains(
    model: nn.Module, kernel, context: torch.Tensor, cfg: SampleConfig, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(tokens[B, L], chain scores[B] or None)``: one chain per row of ``context``; the sampler's own
    log-probability of its tokens when best-of-K will choose by it (``cfg.verifier == "chain"``, ``best_of > 1``)."""
    if cfg.best_of == 1 or cfg.verifier != "chain":  # no scoring work in the sampling loop
        return kind_of(model).sample(model, kernel, context, cfg, generator, None), None
    log_prob = torch.zeros(context.shape[0], dtype=torch.float64, device=context.device)
    return kind_of(model).sample(model, kernel, context, cfg, generator, log_prob), log_prob


def verify_chains(
    context: torch.Tensor,
    tokens: torch.Tensor,
    chain_scores: torch.Tensor | None,
    cfg: SampleConfig,
    task: Task | None = None,
) -> torch.Tensor:
    """``[B]`` float64 scores of finished chains by ``cfg.verifier``: the chain's own log-probability (``"chain"``:
    ``chain_scores`` from :func:`sample_chains`) or the task's rules (``"rules"``:
    :func:`~dihal_fast.hcdlm.rules.rule_scores` of ``task``)."""
    if cfg.verifier == "rules":
        if task is None:
            raise DihalValueError("--verifier rules checks the answers against the task's rules: give the run's task")
        return rule_scores(task, context, tokens)
    if chain_scores is None:
        raise DihalValueError("--verifier chain reads the sampler's own scores: sample with verifier='chain'")
    return chain_scores


def choose(tokens: torch.Tensor, scores: torch.Tensor, k: int) -> torch.Tensor:
    """Per problem (``k`` consecutive rows each), the chain with the highest score (ties: the first)."""
    chains = tokens.view(-1, k, tokens.shape[-1])
    return chains[torch.arange(chains.shape[0], device=tokens.device), scores.view(-1, k).argmax(dim=1)]


def generate(
    model: nn.Module,
    kernel,
    context: torch.Tensor,
    cfg: SampleConfig,
    generator: torch.Generator | None = None,
    task: Task | None = None,
) -> torch.Tensor:
    """Target tokens ``[B, L]`` from whichever model this is; with ``cfg.best_of`` K > 1, K chains per row (run as
    one batch of ``B * K`` rows) and, per row, the one ``cfg.verifier`` scores highest (ties: the first; ``task``:
    the problems' task, which the ``"rules"`` verifier checks)."""
    check_sample(model, cfg)
    k = cfg.best_of
    if k == 1:
        return sample_chains(model, kernel, context, cfg, generator)[0]
    rows = context.repeat_interleave(k, dim=0)
    tokens, chain_scores = sample_chains(model, kernel, rows, cfg, generator)
    return choose(tokens, verify_chains(rows, tokens, chain_scores, cfg, task), k)


class PassCounter:
    """Sampling cost while in use (``with PassCounter(model) as cost: ...``), in rows: ``passes``, the rows through
    the kind's main network (:attr:`ModelKind.main`: HC-DLM's denoiser, a baseline's whole network), and
    ``block_passes``, the rows through any transformer block of the model (encoder and predictor too)."""

    def __init__(self, model: nn.Module) -> None:
        self.main, self.model = kind_of(model).main(model), model
        self.passes, self.block_passes, self._handles = 0, 0, []

    def __enter__(self) -> PassCounter:
        self._handles.append(self.main.register_forward_hook(self._count_main))
        self._handles += [
            m.register_forward_hook(self._count_block) for m in self.model.modules() if isinstance(m, Block)
        ]
        return self

    def _count_main(self, module, args, output) -> None:
        self.passes += args[0].shape[0]

    def _count_block(self, module, args, output) -> None:
        self.block_passes += args[0].shape[0]

    def __exit__(self, *_) -> None:
        for handle in self._handles:
            handle.remove()
