"""Samplers: HC-DLM's latent-carrying loop (paper Algorithm 2), MDM unmasking, AR decoding.

Each takes the model, what it needs of the noise process and a ``SampleConfig``, and returns target
tokens ``[B, L]``. Token draws go through the float64 ``sample_categorical``. Given ``log_prob`` (float64 ``[B]``),
a sampler adds to it the model's log-probability of every token it commits (:func:`answer_log_prob`), which
:func:`~dihal_fast.hcdlm.models.generate` can use to pick the best of ``SampleConfig.best_of`` chains (the kinds and
their dispatch live in :mod:`dihal_fast.hcdlm.models`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dihal_fast.common.sampling import sample_categorical
from dihal_fast.errors import DihalValueError
from dihal_fast.hcdlm.config import SampleConfig
from dihal_fast.hcdlm.networks import HCDLM, ARNet, MDMNet
from dihal_fast.hcdlm.noise import (
    LATENT_FLOW,
    AbsorbingKernel,
    UniformKernel,
    latent_level,
    latent_step,
    scaffold_level,
)

StepHook = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor], None]
# In-sampler interventions (mechanism probes, applied at every step; see sample_hcdlm): what the chain carries is
# replaced by what carries nothing of it, so the accuracy lost is what that state carried.
INTERVENTIONS = ("latent_prior", "latent_other", "latent_reencoded", "scaffold_prior")


def answer_log_prob(logits: torch.Tensor, tokens: torch.Tensor, where: torch.Tensor | None = None) -> torch.Tensor:
    """``[B]`` float64: the summed ``log softmax(logits)[tokens]`` over the positions (``where`` only, if given) of
    ``logits[B, L, V]``: the model's own (untempered) log-probability of the tokens it chose."""
    chosen = torch.log_softmax(logits.to(torch.float64), dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
    return (chosen if where is None else chosen * where).sum(dim=1)


def guided_x0(
    model: HCDLM,
    kernel,
    x_t: torch.Tensor,
    scaffold: torch.Tensor | None,
    s: torch.Tensor,
    context: torch.Tensor,
    weight: float,
    generator: torch.Generator | None,
    x_prev: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x_hat = x_u + w (x_c - x_u)``; the unconditional branch sees a random-token scaffold (as in training).
    ``x_prev``: the previous step's estimate, read by a self-conditioned denoiser."""
    x_cond = model.denoiser(x_t, scaffold, s, context, x_prev=x_prev)
    if not weight or scaffold is None:
        return x_cond
    random_scaffold = kernel.random_tokens(tuple(scaffold.shape), generator, scaffold.device)
    x_uncond = model.denoiser(x_t, random_scaffold, s, context, x_prev=x_prev)
    return x_uncond + weight * (x_cond - x_uncond)


def check_intervention(intervention: str | None, model: HCDLM, batch: int) -> None:
    """Refuse an unknown intervention, a scaffold one without a scaffold, another puzzle's latent in a batch of one."""
    if intervention is None:
        return
    if intervention not in INTERVENTIONS:
        raise DihalValueError(f"intervention must be one of {INTERVENTIONS}, got {intervention!r}")
    if intervention == "scaffold_prior" and not model.scaffold:
        raise DihalValueError("scaffold_prior needs a model with a scaffold (HC-DLM, not Latent DM)")
    if intervention == "latent_other" and batch < 2:
        raise DihalValueError("latent_other swaps latents between puzzles: it needs a batch of at least 2")


@torch.no_grad()
def sample_hcdlm(
    model: HCDLM,
    kernel: UniformKernel | AbsorbingKernel,
    context: torch.Tensor,
    cfg: SampleConfig,
    generator: torch.Generator | None = None,
    on_step: StepHook | None = None,
    log_prob: torch.Tensor | None = None,
    intervention: str | None = None,
) -> torch.Tensor:
    """Algorithm 2: ``x_T ~ N(0, I)``, ``k_T ~ prior``; for ``t = N..1``: ``x_hat_0 = d(x_t, k_t, t/N)``,
    ``k_hat_0 = argmax p(k0 | x_hat_0)``, ``x_{t-1} = x_t - (x_t - x_hat_0)/t``, ``k_{t-1}`` = ``k_hat_0``
    re-noised to level ``(t-1)/N`` (absorbing: the least confident re-masked). Tokens of ``x_0`` at the end.
    The latent is carried from step to step (never re-encoded from tokens, unless ``cfg.clamp``); with
    ``latent_schedule_power`` p != 1 it moves on its own levels ``(t/N)^p``
    (:func:`~dihal_fast.hcdlm.noise.latent_step`); with ``scaffold_floor`` f the scaffold is re-noised to
    ``f + (1 - f)(t-1)/N`` (:func:`~dihal_fast.hcdlm.noise.scaffold_level`).

    With ``cfg.clamp`` (ours), ``x_hat_0`` is replaced by the encoder mean of ``k_hat_0`` before the
    Euler step: the latent carried on is always the code of a definite token sequence.
    ``on_step(t, x_t, x_hat_0, k_t, k_hat_0)`` is called before each update (for diagnostics and tests); ``log_prob``
    gains ``log p(k0 | x_0)`` of the answer read from the final latent.

    ``intervention`` (one of :data:`INTERVENTIONS`, at every step): ``latent_prior``, the denoiser's ``x_t`` a fresh
    N(0, I) draw; ``latent_other``, the ``x_t`` of the next row's chain (another puzzle's); ``latent_reencoded``,
    the carried latent rebuilt from the current tokens alone, ``x_{t-1}`` = the encoder mean of ``k_hat_0`` noised
    afresh to the latent's level at ``t - 1``; ``scaffold_prior``, the scaffold redrawn from the prior instead of
    ``k_hat_0`` re-noised. A self-conditioned denoiser's previous estimate is latent state too: reset, swapped
    and re-encoded with ``x_t``.
    """
    check_intervention(intervention, model, context.shape[0])
    batch, device = context.shape[0], context.device
    shape = (batch, model.cfg.latents, model.cfg.latent_dim)
    x = torch.randn(shape, generator=generator, device=device)
    x_prev: torch.Tensor | None = None  # the last estimate, for a self-conditioned denoiser (part of the latent)
    scaffold = kernel.prior((batch, model.spec.target_len), generator, device) if model.scaffold else None
    for t in range(cfg.steps, 0, -1):
        s = torch.full((batch,), t / cfg.steps, device=device)
        if intervention == "latent_prior":
            x, x_prev = torch.randn(shape, generator=generator, device=device), None
        elif intervention == "latent_other":
            x, x_prev = x.roll(1, dims=0), None if x_prev is None else x_prev.roll(1, dims=0)
        x_hat = guided_x0(model, kernel, x, scaffold, s, context, cfg.cfg_weight, generator, x_prev)
        renoise = scaffold is not None and t > 1
        if renoise or cfg.clamp or on_step is not None or intervention:  # k_hat_0 only where something uses it
            confidence, clean = torch.softmax(model.predictor(x_hat, context).to(torch.float64), dim=-1).max(dim=-1)
            if cfg.clamp:
                x_hat = model.encoder(clean, context)[0]
            if on_step is not None:
                on_step(t, x, x_hat, scaffold, clean)
        if cfg.latent_update == "renoise":
            level = latent_level((t - 1) / cfg.steps, model.cfg.latent_schedule_power)
            eps = torch.randn(shape, generator=generator, device=device)
            x = LATENT_FLOW.noise(x_hat, torch.full((batch,), level, device=device), eps)
        else:
            x = latent_step(x, x_hat, t, cfg.steps, model.cfg.latent_schedule_power)
        x_prev = x_hat if model.cfg.self_condition else None
        if intervention == "latent_reencoded":
            level = latent_level((t - 1) / cfg.steps, model.cfg.latent_schedule_power)
            eps = torch.randn(shape, generator=generator, device=device)
            encoded = model.encoder(clean, context)[0]
            x = LATENT_FLOW.noise(encoded, torch.full((batch,), level, device=device), eps)
            x_prev = encoded if model.cfg.self_condition else None
        if renoise:
            scaffold = (
                kernel.prior(tuple(scaffold.shape), generator, device)
                if intervention == "scaffold_prior"
                else kernel.renoise(
                    clean,
                    scaffold_level((t - 1) / cfg.steps, model.cfg.scaffold_floor),
                    confidence,
                    generator,
                    cfg.remask,
                )
            )
    logits = model.predictor(x, context)
    tokens = sample_categorical(logits, cfg.temperature, generator=generator)
    if log_prob is not None:
        log_prob += answer_log_prob(logits, tokens)
    return tokens


def start_tokens(model, context: torch.Tensor, cfg: SampleConfig) -> torch.Tensor:
    """The token chain's start (MDM, CCDD): all [MASK], or with ``cfg.givens`` on Sudoku the given digits in place
    (an aligned context holds digit ``v`` as ``v``, blank as 0; the target holds ``v - 1``), as a user would start."""
    batch, length = context.shape[0], model.spec.target_len
    tokens = torch.full((batch, length), model.mask_id, dtype=torch.long, device=context.device)
    if cfg.givens and model.spec.name == "sudoku":
        tokens = torch.where(context > 0, context - 1, tokens)
    return tokens


def reveal_counts(masked: torch.Tensor, blanks: torch.Tensor, step: int, cfg: SampleConfig) -> int | torch.Tensor:
    """Slots to reveal at step ``step`` of ``cfg.steps`` so that ``round(b (N - step) / N)`` of a row's ``b`` blank
    slots stay masked: one count for every row when every row starts with all slots blank (the batch's largest), one
    per row with ``cfg.givens``."""
    if not cfg.givens:
        keep_masked = int(round(masked.shape[1] * (cfg.steps - step) / cfg.steps))
        return int(masked.sum(dim=1).max()) - keep_masked
    keep = torch.round(blanks.double() * (cfg.steps - step) / cfg.steps).long()
    return masked.sum(dim=1) - keep


def _confidence(probs: torch.Tensor, chosen: torch.Tensor, order: str) -> torch.Tensor:
    """Top-probability: ``p(chosen)``; margin: ``p(top1) - p(top2)``. ``probs[B, L, V]`` float64."""
    if order == "prob":
        return probs.gather(-1, chosen[..., None]).squeeze(-1)
    top2 = probs.topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def reveal_confident(
    tokens: torch.Tensor,
    logits: torch.Tensor,
    masked: torch.Tensor,
    n_new: int | torch.Tensor,
    cfg: SampleConfig,
    generator: torch.Generator | None,
    log_prob: torch.Tensor | None = None,
) -> torch.Tensor:
    """``tokens`` with the ``n_new`` (one count, or ``[B]`` per row) most confident ``masked`` slots of each row set
    to a draw of ``logits``
    (float64, ``cfg.temperature``; confidence by ``cfg.order``, plus ``cfg.reveal_noise`` times a Gumbel(0, 1) draw
    per slot: the reveal-order noise that makes argmax chains differ); revealed slots stay (MDM, CCDD's token
    chain). ``log_prob`` gains the log-probability of the revealed tokens under ``logits``."""
    if isinstance(n_new, int) and n_new <= 0:
        return tokens
    chosen = sample_categorical(logits, cfg.temperature, generator=generator)
    confidence = _confidence(torch.softmax(logits, dim=-1), chosen, cfg.order)
    if cfg.reveal_noise:
        uniform = torch.rand(confidence.shape, generator=generator, dtype=torch.float64, device=confidence.device)
        confidence = confidence - cfg.reveal_noise * torch.log(-torch.log(uniform.clamp_min(1e-300)))
    confidence = confidence.masked_fill(~masked, -torch.inf)
    if isinstance(n_new, int):
        picked = confidence.topk(n_new, dim=1).indices
        reveal = torch.zeros_like(masked).scatter(1, picked, True) & masked
    else:  # a count per row: the slots ranked below it
        order = confidence.argsort(dim=1, descending=True, stable=True)
        ranks = torch.empty_like(order).scatter_(
            1, order, torch.arange(order.shape[1], device=order.device).expand_as(order)
        )
        reveal = (ranks < n_new[:, None]) & masked
    if log_prob is not None:
        log_prob += answer_log_prob(logits, chosen, reveal)
    return torch.where(reveal, chosen, tokens)


@torch.no_grad()
def sample_mdm(
    model: MDMNet,
    context: torch.Tensor,
    cfg: SampleConfig,
    generator: torch.Generator | None = None,
    on_step: Callable[[int, torch.Tensor], None] | None = None,
    log_prob: torch.Tensor | None = None,
) -> torch.Tensor:
    """Start fully masked; each of ``steps`` steps unmasks the most confident masked slots so that
    ``round(s L)`` stay masked at level ``s = (N - i)/N`` (top-probability or top-margin order).

    ``on_step(i, decoded)`` is called after every step ``i = 1..N`` with the revealed tokens and every
    still-masked slot filled by its argmax (a diagnostic read-out; steps that reveal nothing then cost a
    forward pass too). ``log_prob`` gains each token's log-probability at its reveal.
    """
    tokens = start_tokens(model, context, cfg)
    blanks = (tokens == model.mask_id).sum(dim=1)
    for i in range(1, cfg.steps + 1):
        masked = tokens == model.mask_id
        n_new = reveal_counts(masked, blanks, i, cfg)
        if not int(torch.as_tensor(n_new).max()) > 0 and on_step is None:
            continue
        logits = model(tokens, context).to(torch.float64)
        tokens = reveal_confident(tokens, logits, masked, n_new, cfg, generator, log_prob)
        if on_step is not None:
            on_step(i, torch.where(tokens == model.mask_id, logits.argmax(-1), tokens))
    return tokens


@torch.no_grad()
def sample_ar(
    model: ARNet,
    context: torch.Tensor,
    cfg: SampleConfig,
    generator: torch.Generator | None = None,
    log_prob: torch.Tensor | None = None,
) -> torch.Tensor:
    """Left-to-right decoding (one forward pass per token, keys and values of the prefix kept; ``cfg.steps`` does
    not apply); ``log_prob`` gains the answer's log-likelihood."""
    prefix = torch.full((context.shape[0], 1), model.bos_id, dtype=torch.long, device=context.device)
    caches: list[list[torch.Tensor]] = [[] for _ in model.blocks]
    for _ in range(model.spec.target_len):
        logits = model(context, prefix, caches)[:, -1:]
        token = sample_categorical(logits, cfg.temperature, generator=generator)
        if log_prob is not None:
            log_prob += answer_log_prob(logits, token)
        prefix = torch.cat([prefix, token], dim=1)
    return prefix[:, 1:]
