"""The bridge training objective ``w_diff L_diff + w_rec L_rec + w_lm L_LM + w_kd L_KD`` as one module,
so that both engines (plain torch, DeepSpeed) call a single forward that returns the losses.

* ``L_diff``: MSE between the denoiser output at a random ``t`` and its target (eps, x0 or velocity),
  in the normalised space ``z = (h - mean) / std``.
* ``L_rec``: MSE between the bridge's sampled ``x0`` (the full ``nfe``-step sampler, as at inference,
  differentiated through) and the teacher's ``z``: the fraction of variance of ``h_l`` left unexplained.
* ``L_LM``: next-token cross-entropy of the hybrid's logits (sampled ``h_l`` through the retained layers).
* ``L_KD``: ``T^2 KL(softmax(teacher / T) || softmax(hybrid / T))`` per token (``kd_divergence = "reverse"``: the
  hybrid's distribution first), on the corpus or, on on-policy steps, on the hybrid's own continuations.
All randomness (times, noise) comes in as arguments, so a step is a pure function of its inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dihal_fast.hybrid import HybridLM
from dihal_fast.replace.config import BridgeTrainConfig


def kd_loss(teacher_logits: Tensor, student_logits: Tensor, temperature: float, divergence: str = "forward") -> Tensor:
    """Mean over tokens of ``T^2 KL(softmax(teacher / T) || softmax(student / T))`` (``(..., V)`` logits), or of
    ``KL(student || teacher)`` with ``divergence = "reverse"``."""
    log_p = torch.log_softmax(teacher_logits.float() / temperature, dim=-1)
    log_q = torch.log_softmax(student_logits.float() / temperature, dim=-1)
    if divergence == "reverse":
        log_p, log_q = log_q, log_p
    return temperature**2 * (log_p.exp() * (log_p - log_q)).sum(-1).mean()


def lm_loss(logits: Tensor, input_ids: Tensor) -> Tensor:
    """Next-token cross-entropy: ``logits[:, i]`` predicts ``input_ids[:, i + 1]``."""
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1))


class BridgeObjective(nn.Module):
    """Wraps a HybridLM; ``forward`` returns a dict of the weighted total (``loss``) and each term."""

    def __init__(self, hybrid: HybridLM, config: BridgeTrainConfig):
        super().__init__()
        self.hybrid, self.config = hybrid, config

    def random_inputs(self, batch: int, length: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Times ``t`` ``(B, T)``, noise ``eps`` ``(B, T, D)`` and sampler noise ``(nfe, B, T, D)``."""
        dim, nfe = self.hybrid.bridge.config.hidden_size, self.hybrid.bridge.config.nfe
        return {
            "t": torch.rand(batch, length, generator=generator),
            "eps": torch.randn(batch, length, dim, generator=generator),
            "sample_noise": torch.randn(nfe, batch, length, dim, generator=generator),
        }

    def forward(
        self,
        input_ids: Tensor,
        target_hidden: Tensor,
        teacher_logits: Tensor | None,
        t: Tensor,
        eps: Tensor,
        sample_noise: Tensor,
        decode: bool = True,
        next_token: bool = True,
    ) -> dict[str, Tensor]:
        """The losses of one batch; ``decode = False`` leaves out ``L_LM`` and ``L_KD`` (no retained layer runs),
        ``next_token = False`` leaves out ``L_LM`` (a batch of the hybrid's own samples is no next-token target)."""
        cfg, bridge = self.config, self.hybrid.bridge
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        with torch.no_grad():
            condition = self.hybrid.condition(input_ids, positions)
        z0 = bridge.normalize(target_hidden)
        alpha, sigma = bridge.schedule.alpha_sigma(t.unsqueeze(-1))
        output, x0 = bridge(condition, positions, alpha * z0 + sigma * eps, t, sample_noise)
        terms = {
            "diff": F.mse_loss(output, bridge.prediction.target(z0, eps, t.unsqueeze(-1), bridge.schedule)),
            "rec": F.mse_loss(x0, z0),
        }
        if decode and (cfg.w_lm > 0 or cfg.w_kd > 0):
            logits = self.hybrid.decode(bridge.denormalize(x0), None, positions).to(input_ids.device)
            if next_token:
                terms["lm"] = lm_loss(logits, input_ids)
            if teacher_logits is not None:
                terms["kd"] = kd_loss(teacher_logits, logits, cfg.kd_temperature, cfg.kd_divergence)
        weights = {"diff": cfg.w_diff, "rec": cfg.w_rec, "lm": cfg.w_lm, "kd": cfg.w_kd}
        terms["loss"] = sum(weights[name] * value for name, value in terms.items())
        return terms
