"""Training objectives: the HC-DLM ELBO (also used, scaffold-free, by Latent DM), MDM and AR losses.

Every function takes the model, a batch ``context[B, C]``, ``target[B, L]`` and a ``torch.Generator``
for all its noise (so a resumed run draws the same noise), and returns ``(loss, parts)`` where ``parts``
holds float values for the log.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dihal_fast.errors import DihalValueError
from dihal_fast.hcdlm.config import ObjectiveConfig
from dihal_fast.hcdlm.networks import HCDLM, ARNet, MDMNet
from dihal_fast.hcdlm.noise import LATENT_FLOW, AbsorbingKernel, UniformKernel, latent_level, scaffold_level

LOG_2PI = math.log(2 * math.pi)


def token_ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits[B, L, V]`` against ``target[B, L]``."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))


def sample_latent(mean: torch.Tensor, logvar: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Reparameterised draw ``mean + exp(logvar / 2) * eps``."""
    eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
    return mean + (0.5 * logvar).exp() * eps


def gaussian_log_density(logvar: torch.Tensor, per: int = 1) -> torch.Tensor:
    """``E_q[log q(x)]`` of a diagonal Gaussian (its negative entropy), summed over the latent's
    dimensions as the paper writes it, divided by ``per`` and averaged over the batch. ``logvar[B, M, d]``."""
    return -0.5 * (logvar + LOG_2PI + 1.0).flatten(1).sum(1).mean() / per


def continuous_weight(s: torch.Tensor, kind: str, gamma: float = 5.0) -> torch.Tensor:
    """``omega(s)`` per example: 1, or ``min(SNR(s), gamma) / gamma`` with ``SNR = ((1 - s) / s)^2``."""
    if kind == "none":
        return torch.ones_like(s)
    snr = ((1 - s) / s.clamp_min(1e-6)).pow(2)
    return snr.clamp(max=gamma) / gamma


def token_term(
    logits: torch.Tensor, target: torch.Tensor, hit: torch.Tensor | None, s: torch.Tensor, weighting: str
) -> torch.Tensor:
    """Per-step token loss ``-log p(k0 | x_hat_0)``: mean over all positions (``"all"``), or over the
    positions the kernel corrupted, weighted by ``1 / s`` and divided by the length (``"schedule"``)."""
    ce = F.cross_entropy(logits.float().transpose(1, 2), target, reduction="none")
    if weighting == "all" or hit is None:
        return ce.mean()
    return ((ce * hit).sum(1) / s.clamp_min(1e-3) / target.shape[1]).mean()


def _rows(share: float, scaffold: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A float64 draw per row: True for a share ``share`` of the rows of ``scaffold``."""
    return torch.rand(scaffold.shape[0], generator=generator, dtype=torch.float64, device=scaffold.device) < share


def replace_rows(
    rows: torch.Tensor, tokens: torch.Tensor, scaffold: torch.Tensor, hit: torch.Tensor, level: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(scaffold, hit, level)`` with the ``rows`` replaced by ``tokens``: a scaffold at level 1 (every position
    replaced), so its ``hit`` is all True and its token-term level 1 instead of ``s`` (with ``"schedule"``
    weighting it then counts as a mean CE over all positions, not as ``1/s`` times the positions the kernel
    happened to touch at ``s``)."""
    return (
        torch.where(rows[:, None], tokens, scaffold),
        hit | rows[:, None],
        torch.where(rows, torch.ones_like(level), level),
    )


def drop_scaffolds(
    kernel: UniformKernel | AbsorbingKernel,
    scaffold: torch.Tensor,
    hit: torch.Tensor,
    level: torch.Tensor,
    share: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Guidance's unconditional branch: a share ``share`` of the rows get a scaffold of random tokens
    (:func:`replace_rows`). ``level[B]`` is each row's token-term level so far (``s``, or 1 for a row an earlier
    replacement, :func:`blind_scaffolds`, already took); rows not dropped keep it."""
    drop = _rows(share, scaffold, generator)
    tokens = kernel.random_tokens(tuple(scaffold.shape), generator, scaffold.device)
    return replace_rows(drop, tokens, scaffold, hit, level)


def blind_scaffolds(
    scaffold: torch.Tensor,
    hit: torch.Tensor,
    level: torch.Tensor,
    share: float,
    mask_id: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``ObjectiveConfig.scaffold_blind`` (ours): a share ``share`` of the rows get an all-[MASK] scaffold, so
    their answer can come from ``x_t`` only (:func:`replace_rows`)."""
    blind = _rows(share, scaffold, generator)
    return replace_rows(blind, torch.full_like(scaffold, mask_id), scaffold, hit, level)


@torch.no_grad()
def own_prediction_inputs(
    model: HCDLM,
    kernel: UniformKernel | AbsorbingKernel,
    context: torch.Tensor,
    clean: torch.Tensor,
    target: torch.Tensor,
    s: torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(x_s, k_s)`` built from the model's own prediction, as the sampler builds them.

    At a higher level ``s' ~ U(s, 1)`` the model predicts ``x_hat_0`` from correctly corrupted inputs;
    ``x_s`` then noises that prediction to ``s`` and ``k_s`` re-noises its argmax tokens, so the denoiser
    learns to correct its own guesses (in sampling, ``x_t``'s signal is the model's earlier ``x_hat_0``).
    """
    s_high = s + (1 - s) * torch.rand(s.shape, generator=generator, device=s.device)
    eps = torch.randn(clean.shape, generator=generator, device=clean.device)
    power = model.cfg.latent_schedule_power
    floor = model.cfg.scaffold_floor
    x_high = LATENT_FLOW.noise(clean, latent_level(s_high, power), eps)
    k_high = kernel.corrupt(target, scaffold_level(s_high, floor), generator) if model.scaffold else None
    x_hat = model.denoiser(x_high, k_high, s_high, context)
    eps = torch.randn(clean.shape, generator=generator, device=clean.device)
    x_s = LATENT_FLOW.noise(x_hat, latent_level(s, power), eps)
    if not model.scaffold:
        return x_s, None
    return x_s, kernel.corrupt(model.predictor(x_hat, context).argmax(-1), scaffold_level(s, floor), generator)


def hcdlm_loss(
    model: HCDLM,
    kernel: UniformKernel | AbsorbingKernel,
    context: torch.Tensor,
    target: torch.Tensor,
    cfg: ObjectiveConfig,
    generator: torch.Generator,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``l_recon CE(p(k0|x0)) + l_ent E[log q(x0|k0)] + l_cont omega |d(x_t, k_t, s) - x0|^2
    + l_token CE(p(k0 | d(x_t, k_t, s))) + w_aux CE_masked``.

    ``x0 ~ q(x0 | k0)``; the reconstruction term never touches the denoiser; the token term trains the
    denoiser and the predictor together (the sampler reads tokens exactly this way). One ``t ~ U{1..T}``
    per example, ``s = t / T``; with ``guidance_training`` the scaffold ``k_t ~ q(k_t | k0)`` is replaced by
    random tokens for a share ``scaffold_drop`` of examples (the unconditional branch of classifier-free
    guidance, :func:`drop_scaffolds`). A share ``exposure_share`` of the examples gets ``(x_t, k_t)`` from
    :func:`own_prediction_inputs`. With ``latent_schedule_power`` p the latent is noised to ``s ** p``
    (:func:`~dihal_fast.hcdlm.noise.latent_level`), with ``scaffold_floor`` f the scaffold to ``f + (1 - f) s``
    (:func:`~dihal_fast.hcdlm.noise.scaffold_level`); ``scaffold_blind`` gives a share of the rows an all-[MASK]
    scaffold (:func:`blind_scaffolds`). With ``self_condition`` half the batches first predict ``x_hat_0`` without
    gradient and the denoiser then reads it (self-conditioning; the rest read none). The auxiliary term encodes
    ``k0`` with ``mask_aux_rate`` of its tokens set to [MASK] and scores the masked positions. With
    ``detach_latents`` no regression gradient reaches the encoder.
    """
    batch, device = target.shape[0], target.device
    mean, logvar = model.encoder(target, context)
    x_0 = sample_latent(mean, logvar, generator)
    recon = token_ce(model.predictor(x_0, context), target)
    # The ELBO sums CE over the L tokens and the Gaussian terms over the M*d latent dimensions; every
    # term here is divided by L (CE as a per-token mean), which keeps the paper's balance between them.
    length = target.shape[1]
    neg_entropy = gaussian_log_density(logvar, per=length)

    t = torch.randint(1, cfg.timesteps + 1, (batch,), generator=generator, device=device)
    s = t.float() / cfg.timesteps
    eps = torch.randn(x_0.shape, generator=generator, device=device)
    clean = x_0.detach() if cfg.detach_latents else x_0
    s_latent = latent_level(s, model.cfg.latent_schedule_power)  # s itself unless latent_schedule_power != 1
    x_t = LATENT_FLOW.noise(clean, s_latent, eps)
    level = scaffold_level(s, model.cfg.scaffold_floor)  # s itself unless scaffold_floor > 0
    scaffold, hit = kernel.corrupt_with_mask(target, level, generator) if model.scaffold else (None, None)
    own = torch.rand(batch, generator=generator, dtype=torch.float64, device=device) < cfg.exposure_share
    if bool(own.any()):
        x_own, k_own = own_prediction_inputs(
            model, kernel, context[own], clean.detach()[own], target[own], s[own], generator
        )
        x_t = x_t.index_put((own,), x_own)
        if scaffold is not None:
            scaffold = scaffold.index_put((own,), k_own)
            hit = hit.index_put((own,), k_own != target[own])
    if cfg.latent_drop:
        blind = torch.rand(batch, generator=generator, dtype=torch.float64, device=device) < cfg.latent_drop
        x_t = torch.where(blind[:, None, None], eps, x_t)
    if scaffold is not None and cfg.scaffold_blind:
        scaffold, hit, level = blind_scaffolds(scaffold, hit, level, cfg.scaffold_blind, model.mask_id, generator)
    if scaffold is not None and cfg.guidance_training:
        scaffold, hit, level = drop_scaffolds(kernel, scaffold, hit, level, cfg.scaffold_drop, generator)
    x_prev = None
    if model.cfg.self_condition and bool(torch.rand((), generator=generator, device=device) < 0.5):
        with torch.no_grad():  # the estimate a sampling step would have from the step before
            x_prev = model.denoiser(x_t, scaffold, s, context)
    x_hat, slot_logits = model.denoiser(x_t, scaffold, s, context, slot_logits=True, x_prev=x_prev)
    cont = (continuous_weight(s_latent, cfg.cont_weighting) * (x_hat - clean).pow(2).flatten(1).sum(1)).mean() / length

    loss = cfg.lambda_recon * recon + cfg.lambda_ent * neg_entropy + cfg.lambda_cont * cont
    parts = {"recon": recon.item(), "neg_entropy": neg_entropy.item(), "cont": cont.item()}
    if cfg.lambda_token:
        token = token_term(
            model.predictor(x_hat, context), target, hit, level, cfg.token_weighting_for(model.cfg.kernel)
        )
        loss = loss + cfg.lambda_token * token
        parts["token"] = token.item()
    if cfg.slot_aux_weight:
        if slot_logits is None:
            raise DihalValueError("slot_aux_weight needs a denoiser with a slot head (HCDLMModelConfig.slot_head=True)")
        slot_aux = token_ce(slot_logits, target)
        loss = loss + cfg.slot_aux_weight * slot_aux
        parts["slot_aux"] = slot_aux.item()
    if cfg.mask_aux_weight:
        hide = torch.rand(target.shape, generator=generator, dtype=torch.float64, device=device) < cfg.mask_aux_rate
        mean_m, logvar_m = model.encoder(target.masked_fill(hide, model.mask_id), context)
        logits = model.predictor(sample_latent(mean_m, logvar_m, generator), context)
        aux = F.cross_entropy(logits.float()[hide], target[hide]) if bool(hide.any()) else logits.sum() * 0.0
        loss = loss + cfg.mask_aux_weight * aux
        parts["mask_aux"] = aux.item()
    parts["loss"] = loss.item()
    return loss, parts


def mdm_loss(
    model: MDMNet, context: torch.Tensor, target: torch.Tensor, generator: torch.Generator, min_level: float = 1e-3
) -> tuple[torch.Tensor, dict[str, float]]:
    """Masked-diffusion ELBO (linear schedule): ``E_s[ (1/s) sum_masked CE ] / L`` with ``s ~ U(0, 1]``."""
    batch, length = target.shape
    s = torch.rand(batch, generator=generator, dtype=torch.float64, device=target.device).clamp_min(min_level)
    masked = torch.rand(target.shape, generator=generator, dtype=torch.float64, device=target.device) < s[:, None]
    logits = model(target.masked_fill(masked, model.mask_id), context)
    ce = F.cross_entropy(logits.float().transpose(1, 2), target, reduction="none")
    weighted = (ce * masked / s[:, None].float()).sum(dim=1) / length
    loss = weighted.mean()
    masked_ce = (ce * masked).sum() / masked.sum().clamp_min(1)
    return loss, {"loss": loss.item(), "masked_ce": masked_ce.item()}


def ar_loss(
    model: ARNet, context: torch.Tensor, target: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, dict[str, float]]:
    """Next-token cross-entropy with teacher forcing (the generator is unused: AR training is noise-free)."""
    bos = torch.full((target.shape[0], 1), model.bos_id, dtype=torch.long, device=target.device)
    logits = model(context, torch.cat([bos, target[:, :-1]], dim=1))
    loss = token_ce(logits, target)
    return loss, {"loss": loss.item()}
