"""The one table of HC-DLM's model kinds: each kind (``HCDLMModelConfig.kind``) registers how it is built, trained,
sampled and traced step by step, and whether its chains are all the same at temperature 0.

The trainer, the samplers' front door (:func:`generate`), scoring, the mechanism diagnostics and the API look a kind
up here (:func:`kind_of`, :data:`KINDS`) instead of testing model classes, so adding a baseline is one entry.

A *verifier* scores finished answers so that best-of-K can pick one (``SampleConfig.verifier``), the same way for
every kind: ``"chain"`` is the log-probability the sampler itself gave its tokens (summed at each commit; it checks
nothing), ``"rules"`` the task's rules (:mod:`dihal_fast.hcdlm.rules`; no network pass).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

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


def _nothing(model: nn.Module) -> tuple[nn.Module | None, ...]:
    return ()


def _encoder_and_slot_head(model: nn.Module) -> tuple[nn.Module | None, ...]:
    return model.encoder, model.denoiser.slot_head


@dataclass(frozen=True)
class ModelKind:
    """One model kind: ``build(spec, cfg)``; ``loss(model, kernel, context, target, objective, generator)``;
    ``sample(model, kernel, context, cfg, generator, log_prob)`` (one chain per row, ``log_prob`` gains the chain
    score when given); ``trace(model, kernel, context, cfg, generator)`` (the decoded answer after every step, None:
    no steps); ``deterministic_at_t0`` (every chain the same at temperature 0 without reveal noise, so best-of-K
    there is refused); ``latent`` (an encoder / denoiser / predictor the mechanism probes can open); ``main`` (the
    module whose forward calls count as the kind's forward passes); ``unread_sample`` (the :class:`SampleConfig`
    fields its sampler never reads, refused by :func:`check_sample` when they differ from their defaults; every kind
    reads ``steps`` but AR, whose ``steps`` is let through so that one sampler config serves every kind);
    ``not_sampled`` (the modules a chain of the default sampler never runs, None where the model has none: HC-DLM's
    and Latent DM's encoder and the denoiser's training-only slot head; :func:`sampling_parameters`)."""

    name: str
    build: Callable[[TaskSpec, HCDLMModelConfig], nn.Module]
    loss: Loss
    sample: Sampler
    trace: Trace | None = None
    deterministic_at_t0: bool = True
    latent: bool = False
    main: Callable[[nn.Module], nn.Module] = _whole
    unread_sample: tuple[str, ...] = ()
    not_sampled: Callable[[nn.Module], tuple[nn.Module | None, ...]] = _nothing


def sampling_parameters(model: nn.Module) -> int:
    """The parameters a chain of ``model`` reads when it samples (the count the paper matches models on): a
    baseline's all (MDM, CCDD and AR sample with their whole network), HC-DLM's and Latent DM's without what
    :attr:`ModelKind.not_sampled` lists (the encoder and the training-only slot head; ``--clamp`` and the re-encoding
    diagnostics, not the default sampler, run the encoder too)."""
    unused = [module for module in kind_of(model).not_sampled(model) if module is not None]
    return count_parameters(model) - sum(count_parameters(module) for module in unused)


def _blocks_field(kind: str) -> str:
    """The config field that sets how many blocks a kind's sampled network has."""
    return "denoiser_blocks" if KINDS[kind].latent else "baseline_blocks"


def _closest_blocks(spec: TaskSpec, cfg: HCDLMModelConfig, target: int) -> tuple[int, int]:
    """``(blocks, sampling parameters)`` of ``cfg.kind`` at ``cfg``'s width, the count closest to ``target`` (at least
    one block): the count is linear in the blocks, read off the networks of one and two blocks."""
    one, two = (sampling_parameters(build_model(spec, replace(cfg, **{_blocks_field(cfg.kind): n}))) for n in (1, 2))
    blocks = max(1, round((target - (2 * one - two)) / (two - one)))
    return blocks, 2 * one - two + blocks * (two - one)


def matched_blocks(spec: TaskSpec, cfg: HCDLMModelConfig, kind: str) -> int:
    """Blocks a baseline needs to come closest to the HC-DLM parameter count, encoder included (at least one):
    ``baseline_blocks=0``'s meaning, kept for the runs trained with it; :func:`matched_shape` matches on sampling
    parameters instead."""
    if cfg.baseline_blocks:
        return cfg.baseline_blocks
    return _closest_blocks(spec, replace(cfg, kind=kind), count_parameters(HCDLM(spec, cfg)))[0]


def matched_shape(
    spec: TaskSpec, cfg: HCDLMModelConfig, widths: Sequence[int] = (), target: int | None = None
) -> dict[str, int]:
    """The width among ``widths`` (default: ``cfg.hidden``) and the block count at which ``cfg.kind`` samples with
    the parameter count closest to ``target`` (default: the sampling parameters of the HC-DLM of ``cfg``'s fields;
    ties: the first width), as run fields: ``{"hidden": W, "baseline_blocks": N}`` (``denoiser_blocks`` for HC-DLM
    and Latent DM), e.g. for the protocol bench's ``--run-fields``."""
    if target is None:
        target = sampling_parameters(HCDLM(spec, cfg))
    best: tuple[int, dict[str, int]] | None = None
    for width in widths or (cfg.hidden,):
        blocks, count = _closest_blocks(spec, replace(cfg, hidden=width), target)
        if best is None or abs(count - target) < best[0]:
            best = (abs(count - target), {"hidden": width, _blocks_field(cfg.kind): blocks})
    assert best is not None
    return best[1]


PARAMETER_TOLERANCE = 0.10  # a baseline's parameter count may differ from its HC-DLM's by this share


def parameter_match(spec: TaskSpec, cfg: HCDLMModelConfig) -> dict[str, float | int | bool]:
    """``{parameters, hcdlm_parameters, ratio, matched, sampling_parameters, hcdlm_sampling_parameters,
    sampling_ratio}``: this kind's count against the HC-DLM of the same fields, all parameters (``matched`` when
    within :data:`PARAMETER_TOLERANCE`, what ``baseline_blocks=0`` matches) and those a chain reads when it samples
    (:func:`sampling_parameters`, the paper's count); a record prints every count either way."""
    model, reference = build_model(spec, cfg), HCDLM(spec, cfg)
    count, reference_count = count_parameters(model), count_parameters(reference)
    sampling, reference_sampling = sampling_parameters(model), sampling_parameters(reference)
    return {
        "parameters": count,
        "hcdlm_parameters": reference_count,
        "ratio": count / reference_count,
        "matched": abs(count / reference_count - 1) <= PARAMETER_TOLERANCE,
        "sampling_parameters": sampling,
        "hcdlm_sampling_parameters": reference_sampling,
        "sampling_ratio": sampling / reference_sampling,
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
        not_sampled=_encoder_and_slot_head,
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


COMMON_WIDTH = 64  # the width block passes are stated at across kinds of other widths (HC-DLM's default)
COSTS = ("passes", "block_passes", "width64_block_passes")  # PassCounter's figures, in rows


class PassCounter:
    """Sampling cost while in use (``with PassCounter(model) as cost: ...``), in rows: ``passes``, the rows through
    the kind's main network (:attr:`ModelKind.main`: HC-DLM's denoiser, a baseline's whole network);
    ``block_passes``, the rows through any transformer block of the model (encoder and predictor too); and
    ``width64_block_passes``, those at the :data:`COMMON_WIDTH`: each block's rows times (its width / 64) ** 2, the
    size of its weight matrices against a width-64 block's (a width-128 block pass counts 4)."""

    def __init__(self, model: nn.Module) -> None:
        self.main, self.model = kind_of(model).main(model), model
        self.passes, self.block_passes, self.width64_block_passes = 0, 0, 0.0
        self._handles: list = []

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
        self.width64_block_passes += args[0].shape[0] * (module.hidden / COMMON_WIDTH) ** 2

    def figures(self) -> dict[str, float]:
        """The counts so far, by :data:`COSTS`."""
        return {name: getattr(self, name) for name in COSTS}

    def __exit__(self, *_) -> None:
        for handle in self._handles:
            handle.remove()
