"""CCDD, HC-DLM's strongest same-scale baseline (Zhou et al. 2025, "Coevolutionary Continuous Discrete
Diffusion", arXiv 2510.03206; HC-DLM's Table 10): a discrete token chain and a continuous embedding chain,
corrupted independently and denoised together by one network, each conditioning the other.

State at level ``s``: tokens ``k_s[B, L]`` (each slot [MASK]ed with probability ``s``: the masked CTMC) and
embeddings ``z_s = (1 - s) z_0 + s eps`` of ``z_0 = E[k_0]`` (``[B, L, d]``, ``d = latent_dim``). The network
reads both at every slot and predicts the clean tokens (logits) and ``z_0``. Sampling starts from all-[MASK]
and ``z_1 ~ N(0, I)``; every step moves both chains from the same prediction: the most confident masked
slots are revealed and stay (the token chain of MDM), and ``z`` takes the x0-prediction Euler step.

The paper's: the joint state, independent forward corruption of the two chains, one network denoising both
with each chain conditioning the other, the masked token chain with its ELBO (``1/s``-weighted CE on masked
slots), an x0-regression on the continuous chain, revealed tokens kept. Ours, for a CPU-scale, same-harness
comparison with HC-DLM:
- the embedding space: a fixed random code per token (:data:`CODE_SEED`, layer-normalised to the scale of
  the N(0, I) noise, not trained; the paper uses a pretrained LM's representations or token embeddings, and
  Sudoku has no pretrained encoder);
- the noise schedule: one level ``s = t / T`` for both chains, the linear masking rate and HC-DLM's straight
  (rectified-flow) latent path :data:`~dihal_fast.hcdlm.noise.LATENT_FLOW` (the paper: a Gaussian SDE /
  probability-flow ODE, with the option of separate schedules);
- the network: one stream that sums a slot's token embedding and its projected ``z_s`` (the paper's MDiT /
  MMDiT / MoEDiT keep per-modality streams), adaLN-Zero (DiT) blocks on ``s``, as many as match the HC-DLM
  parameter count (``baseline_blocks=0``, as for MDM and AR);
- the loss weights: ``token ELBO + lambda_cont * omega(s) * MSE(z_hat, z_0)`` (mean over slots and
  dimensions), ``lambda_cont`` and ``cont_weighting`` of :class:`~dihal_fast.hcdlm.config.ObjectiveConfig`;
- the sampler: both chains updated from one forward pass per step (the paper's factored kernel alternates
  the two updates as micro-steps), the MDM confidence order of ``SampleConfig.order`` for the reveals;
- the training state at masked slots: the paper corrupts the two chains independently, so a masked slot's
  embedding is ``(1 - s) E[k_0] + s eps`` of its *true* token. With a fixed code of a few tokens that is the answer
  in the clear at any ``s < 1`` (a token head trained so reads it, and fails when the sampler's own embeddings take
  its place), so here a masked slot's embedding is the model's own no-grad guess from a higher noise level, noised
  to ``s`` (:func:`ccdd_inputs`; one extra forward pass per training step), the state the sampler builds.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from dihal_fast.hcdlm.config import HCDLMModelConfig, ObjectiveConfig, SampleConfig
from dihal_fast.hcdlm.layers import Block, TimeEmbedding, run_blocks
from dihal_fast.hcdlm.networks import TokenSlots
from dihal_fast.hcdlm.noise import LATENT_FLOW
from dihal_fast.hcdlm.objective import continuous_weight, token_term
from dihal_fast.hcdlm.sampler import reveal_confident, reveal_counts, start_tokens
from dihal_fast.tasks.base import TaskSpec

CODE_SEED = 0  # the fixed token code is drawn from its own generator: the same table in every run and process


def token_code(vocab: int, dim: int) -> torch.Tensor:
    """``[vocab, dim]``: N(0, 1) vectors, layer-normalised (mean 0, variance 1 per row), from :data:`CODE_SEED`."""
    table = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(CODE_SEED))
    return F.layer_norm(table, (dim,))


class CCDDNet(nn.Module):
    """One transformer over the ``L`` slots; slot ``i`` reads ``k_s[i]`` (token embedding, [MASK] included),
    ``z_s[i]`` (linear projection), its position and the aligned context; adaLN-Zero blocks on ``s``.
    ``forward -> (logits[B, L, V], z_hat[B, L, d])``."""

    kind = "ccdd"

    def __init__(self, spec: TaskSpec, cfg: HCDLMModelConfig, blocks: int) -> None:
        super().__init__()
        self.spec, self.cfg = spec, cfg
        self.slots = TokenSlots(spec, cfg.hidden)
        self.embed_in = nn.Linear(cfg.latent_dim, cfg.hidden)
        self.time = TimeEmbedding(cfg.hidden)
        self.blocks = nn.ModuleList(
            Block(cfg.hidden, cfg.heads, cfg.dropout, cond_dim=cfg.hidden) for _ in range(blocks)
        )
        self.out_norm = nn.LayerNorm(cfg.hidden)
        self.token_head = nn.Linear(cfg.hidden, spec.target_vocab)
        self.embed_head = nn.Linear(cfg.hidden, cfg.latent_dim)
        # not a parameter (no gradient, not in the checkpoint): rebuilt identically from CODE_SEED on load
        self.register_buffer("code", token_code(spec.target_vocab, cfg.latent_dim), persistent=False)

    @property
    def mask_id(self) -> int:
        return self.spec.target_vocab

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """``z_0 = E[k_0]``: the fixed code of ``tokens[B, L]`` (ids below the vocabulary) -> ``[B, L, d]``."""
        return self.code[tokens]

    def forward(
        self, z_t: torch.Tensor, tokens: torch.Tensor, s: torch.Tensor, context: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        prefix, slots = self.slots(tokens, context, tokens.shape[0])
        h = run_blocks(self.blocks, [slots + self.embed_in(z_t), prefix], self.time(s))
        h = self.out_norm(h[:, : slots.shape[1]])
        return self.token_head(h), self.embed_head(h)


@torch.no_grad()
def _guessed_embeddings(
    model: CCDDNet,
    context: torch.Tensor,
    target: torch.Tensor,
    code: torch.Tensor,
    hidden: torch.Tensor,
    s: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """``z_hat_0`` of one no-grad pass at level ``s`` whose ``hidden`` slots get [MASK] and pure noise (nothing of
    their true token) and whose other slots their token and its noised code."""
    eps = torch.randn(code.shape, generator=generator, device=code.device)
    z = torch.where(hidden[..., None], eps, LATENT_FLOW.noise(code, s, eps))
    return model(z, target.masked_fill(hidden, model.mask_id), s, context)[1]


def ccdd_inputs(
    model: CCDDNet, context: torch.Tensor, target: torch.Tensor, s: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(z_s, k_s, masked)``: the joint state at level ``s`` with no masked slot holding anything derived from its
    true token. Revealed slots carry their token and its code noised to ``s``; a masked slot's embedding is the
    model's own guess noised to ``s``, from a no-grad pass at a higher level ``s' ~ U(s, 1)`` whose masked slots
    (every slot masked at ``s`` and more: nested masks from one float64 uniform per slot) held pure noise - as in
    sampling, where a masked slot's embedding is built from the model's earlier predictions."""
    masks = torch.rand(target.shape, generator=generator, dtype=torch.float64, device=target.device)
    masked = masks < s[:, None]
    s_high = s + (1 - s) * torch.rand(s.shape, generator=generator, device=s.device)
    code = model.embed(target)
    guess = _guessed_embeddings(model, context, target, code, masks < s_high[:, None], s_high, generator)
    eps = torch.randn(code.shape, generator=generator, device=code.device)
    z_s = torch.where(masked[..., None], LATENT_FLOW.noise(guess, s, eps), LATENT_FLOW.noise(code, s, eps))
    return z_s, target.masked_fill(masked, model.mask_id), masked


def ccdd_loss(
    model: CCDDNet, context: torch.Tensor, target: torch.Tensor, cfg: ObjectiveConfig, generator: torch.Generator
) -> tuple[torch.Tensor, dict[str, float]]:
    """``E_s[(1/s) sum_masked CE] / L + lambda_cont omega(s) |z_hat - z_0|^2`` (MSE per slot and dimension),
    both chains at one level ``s = t / T``, ``t ~ U{1..T}``, inputs from :func:`ccdd_inputs`."""
    batch, device = target.shape[0], target.device
    t = torch.randint(1, cfg.timesteps + 1, (batch,), generator=generator, device=device)
    s = t.float() / cfg.timesteps
    z_t, tokens, masked = ccdd_inputs(model, context, target, s, generator)
    logits, z_hat = model(z_t, tokens, s, context)
    token = token_term(logits, target, masked, s, "schedule")
    cont = (continuous_weight(s, cfg.cont_weighting) * (z_hat - model.embed(target)).pow(2).flatten(1).mean(1)).mean()
    loss = token + cfg.lambda_cont * cont
    return loss, {"loss": loss.item(), "token": token.item(), "cont": cont.item()}


@torch.no_grad()
def sample_ccdd(
    model: CCDDNet,
    context: torch.Tensor,
    cfg: SampleConfig,
    generator: torch.Generator | None = None,
    on_step: Callable[[int, torch.Tensor], None] | None = None,
    log_prob: torch.Tensor | None = None,
) -> torch.Tensor:
    """``N = cfg.steps`` joint steps from all-[MASK] and ``z ~ N(0, I)``: at step ``i`` (level ``s = (N-i+1)/N``)
    one forward pass gives the token logits and ``z_hat_0``; the most confident masked slots are revealed so
    that ``round(L (N-i)/N)`` stay masked, and ``z <- z - (z - z_hat_0) / (N-i+1)``.

    ``on_step(i, decoded)`` (as in :func:`~dihal_fast.hcdlm.sampler.sample_mdm`) gets the revealed tokens with
    every still-masked slot filled by its argmax; ``log_prob`` gains each token's log-probability at its reveal.
    """
    batch, length, device = context.shape[0], model.spec.target_len, context.device
    tokens = start_tokens(model, context, cfg)
    blanks = (tokens == model.mask_id).sum(dim=1)
    z = torch.randn((batch, length, model.cfg.latent_dim), generator=generator, device=device)
    for i in range(1, cfg.steps + 1):
        t = cfg.steps - i + 1
        logits, z_hat = model(z, tokens, torch.full((batch,), t / cfg.steps, device=device), context)
        logits = logits.to(torch.float64)
        masked = tokens == model.mask_id
        tokens = reveal_confident(
            tokens, logits, masked, reveal_counts(masked, blanks, i, cfg), cfg, generator, log_prob
        )
        z = LATENT_FLOW.euler_step(z, z_hat, t)
        if on_step is not None:
            on_step(i, torch.where(tokens == model.mask_id, logits.argmax(-1), tokens))
    return tokens
