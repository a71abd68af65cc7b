"""Training objectives: the HC-DLM ELBO (also used, scaffold-free, by Latent DM), MDM and AR losses.

Every function takes the model, a batch ``context[B, C]``, ``target[B, L]`` and a ``torch.Generator``
for all its noise (so a resumed run draws the same noise), and returns ``(loss, parts)`` where ``parts``
holds float values for the log.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dihal_fast.hcdlm.config import ObjectiveConfig
from dihal_fast.hcdlm.kernels import FlowSchedule, UniformKernel, AbsorbingKernel
from dihal_fast.hcdlm.models import ARNet, HCDLM, MDMNet

LOG_2PI = math.log(2 * math.pi)


def token_ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits[B, L, V]`` against ``target[B, L]``."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))


def sample_latent(mean: torch.Tensor, logvar: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Reparameterised draw ``mean + exp(logvar / 2) * eps``."""
    eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
    return mean + (0.5 * logvar).exp() * eps


def gaussian_log_density_mean(logvar: torch.Tensor) -> torch.Tensor:
    """``E_q[log q(x)]`` per dimension of a diagonal Gaussian (the negative entropy), averaged."""
    return -0.5 * (logvar + LOG_2PI + 1.0).mean()


def hcdlm_loss(model: HCDLM, kernel: UniformKernel | AbsorbingKernel, context: torch.Tensor, target: torch.Tensor,
               cfg: ObjectiveConfig, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
    """``l_recon CE(p(k0|x0)) + l_ent E[log q(x0|k0)] + l_cont |d(x_t, k_t, s) - x0|^2 + w_aux CE_masked``.

    ``x0 ~ q(x0 | k0)``; the reconstruction term never touches the denoiser. One ``t ~ U{1..T}`` per
    example, ``s = t / T``; the scaffold ``k_t ~ q(k_t | k0)`` is replaced by random tokens for a share
    ``scaffold_drop`` of examples (the unconditional branch of classifier-free guidance). The auxiliary
    term encodes ``k0`` with ``mask_aux_rate`` of its tokens set to [MASK] and asks for all of ``k0`` back.
    With ``detach_latents`` the regression term trains the denoiser only (no gradient into the encoder).
    """
    batch, device = target.shape[0], target.device
    mean, logvar = model.encoder(target, context)
    x_0 = sample_latent(mean, logvar, generator)
    recon = token_ce(model.predictor(x_0, context), target)
    neg_entropy = gaussian_log_density_mean(logvar)

    t = torch.randint(1, cfg.timesteps + 1, (batch,), generator=generator, device=device)
    s = t.float() / cfg.timesteps
    eps = torch.randn(x_0.shape, generator=generator, device=device)
    clean = x_0.detach() if cfg.detach_latents else x_0
    x_t = FlowSchedule.noise(clean, s, eps)
    scaffold = None
    if model.scaffold:
        scaffold = kernel.corrupt(target, s, generator)
        drop = torch.rand(batch, generator=generator, dtype=torch.float64, device=device) < cfg.scaffold_drop
        scaffold = torch.where(drop[:, None], kernel.random_tokens(tuple(target.shape), generator, device), scaffold)
    cont = (model.denoiser(x_t, scaffold, s, context) - clean).pow(2).mean()

    loss = cfg.lambda_recon * recon + cfg.lambda_ent * neg_entropy + cfg.lambda_cont * cont
    parts = {"recon": recon.item(), "neg_entropy": neg_entropy.item(), "cont": cont.item()}
    if cfg.mask_aux_weight:
        hide = torch.rand(target.shape, generator=generator, dtype=torch.float64, device=device) < cfg.mask_aux_rate
        mean_m, logvar_m = model.encoder(target.masked_fill(hide, model.mask_id), context)
        aux = token_ce(model.predictor(sample_latent(mean_m, logvar_m, generator), context), target)
        loss = loss + cfg.mask_aux_weight * aux
        parts["mask_aux"] = aux.item()
    parts["loss"] = loss.item()
    return loss, parts


def mdm_loss(model: MDMNet, context: torch.Tensor, target: torch.Tensor, generator: torch.Generator,
             min_level: float = 1e-3) -> tuple[torch.Tensor, dict[str, float]]:
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


def ar_loss(model: ARNet, context: torch.Tensor, target: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
    """Next-token cross-entropy with teacher forcing (the generator is unused: AR training is noise-free)."""
    bos = torch.full((target.shape[0], 1), model.bos_id, dtype=torch.long, device=target.device)
    logits = model(context, torch.cat([bos, target[:, :-1]], dim=1))
    loss = token_ce(logits, target)
    return loss, {"loss": loss.item()}
