"""The two forward noise processes of HC-DLM: the latent flow and the token scaffold's corruption.

Latent: the straight (rectified-flow) path ``x_s = (1 - s) x_0 + s eps`` with ``s = t / T``, the same
:class:`~dihal_fast.bridge.schedules.FlowSchedule` the diffusion bridge uses (:data:`LATENT_FLOW`);
the sampler's x0-prediction Euler step is ``x_{t-1} = x_t - (x_t - x_hat_0) / t``.

Tokens: ``alpha(s) = 1 - s`` of the tokens are kept; the rest become a uniform random token
(:class:`UniformKernel`) or [MASK] (:class:`AbsorbingKernel`). "Kernel" here is the Markov transition
kernel ``q(k_s | k_0)`` of discrete diffusion (D3PM's term, and ``HCDLMModelConfig.kernel``), not compiled
code: the compiled kernels live in ``csrc/`` and :mod:`dihal_fast.geometry`.
All random decisions on tokens are drawn from float64 uniforms.
"""

from __future__ import annotations

import torch

from dihal_fast.bridge.schedules import FlowSchedule
from dihal_fast.errors import DihalValueError

LATENT_FLOW = FlowSchedule()
"""The path of HC-DLM's continuous latents: ``LATENT_FLOW.noise(x_0, s, eps)``, ``LATENT_FLOW.euler_step(x_t,
x_hat_0, t)``."""


def latent_level(s: torch.Tensor | float, power: float = 1.0) -> torch.Tensor | float:
    """The latent's noise level at the scaffold's level ``s``: ``s ** power`` (``power`` 1: the same level, the
    paper's; > 1: the latent less noisy than the scaffold at every ``0 < s < 1``, ours,
    ``HCDLMModelConfig.latent_schedule_power``). Both are pure noise at ``s = 1`` and clean at 0."""
    return s if power == 1.0 else s**power


def scaffold_level(s: torch.Tensor | float, floor: float = 0.0) -> torch.Tensor | float:
    """The token scaffold's noise level at level ``s``: ``floor + (1 - floor) s`` (``floor`` 0: ``s`` itself, the
    paper's; > 0: the scaffold stays at least ``floor`` noisy, the last step included, so the answer cannot be copied
    from it and must travel in the latent, ours, ``HCDLMModelConfig.scaffold_floor``). Pure noise at ``s = 1``."""
    return s if floor == 0.0 else floor + (1.0 - floor) * s


def latent_step(x_t: torch.Tensor, x_hat_0: torch.Tensor, step: int, steps: int, power: float = 1.0) -> torch.Tensor:
    """The latent at step ``step - 1`` of ``steps`` from step ``step`` given ``x_hat_0``, on the latent's own levels
    ``a = latent_level(step / steps)`` -> ``b = latent_level((step - 1) / steps)``: ``x_hat_0 + (b / a)(x_t - x_hat_0)``
    (the deterministic DDIM step of the straight path; ``power`` 1: :meth:`FlowSchedule.euler_step`, bit for bit)."""
    if power == 1.0:
        return LATENT_FLOW.euler_step(x_t, x_hat_0, step)
    if step < 1:
        raise DihalValueError(f"latent steps run from step = N down to 1, got step={step}")
    ratio = latent_level((step - 1) / steps, power) / latent_level(step / steps, power)
    return x_hat_0 + ratio * (x_t - x_hat_0)


def _uniform64(shape: tuple[int, ...], generator: torch.Generator | None, device) -> torch.Tensor:
    return torch.rand(shape, dtype=torch.float64, generator=generator, device=device)


def _level(s: torch.Tensor | float, tokens: torch.Tensor) -> torch.Tensor:
    s = torch.as_tensor(s, dtype=torch.float64, device=tokens.device)
    if s.dim() == 0:
        s = s.expand(tokens.shape[0])
    return s.view(-1, *([1] * (tokens.dim() - 1)))


class _TokenKernel:
    """Shared part of the discrete kernels: the vocabulary and uniform random tokens."""

    def __init__(self, vocab: int) -> None:
        if vocab < 2:
            raise DihalValueError(f"vocab must be >= 2, got {vocab}")
        self.vocab = vocab

    def random_tokens(
        self, shape: tuple[int, ...], generator: torch.Generator | None = None, device="cpu"
    ) -> torch.Tensor:
        return torch.randint(self.vocab, shape, generator=generator, device=device)

    def corrupt(
        self, tokens: torch.Tensor, s: torch.Tensor | float, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """A draw of ``q(k_s | k_0)`` for ``tokens[B, L]`` and levels ``s`` (scalar or ``[B]``)."""
        return self.corrupt_with_mask(tokens, s, generator)[0]

    def corrupt_with_mask(
        self, tokens: torch.Tensor, s: torch.Tensor | float, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k_s, hit)``: the corrupted tokens and which positions the kernel touched (prob. ``s`` each)."""
        hit = _uniform64(tuple(tokens.shape), generator, tokens.device) < _level(s, tokens)
        return self._replace(tokens, hit, generator), hit

    paper_remask = "random"  # the paper's sampler re-noises the uniform scaffold at every position in parallel

    def renoise(
        self,
        tokens: torch.Tensor,
        s: float,
        confidence: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        mode: str = "auto",
    ) -> torch.Tensor:
        """Re-noise predicted clean tokens to level ``s``: every position independently (``"random"``: the
        paper's uniform sampler), or exactly the ``round(s L)`` least confident positions of each row
        (``"confidence"``: the paper's re-masking for the absorbing kernel; with the uniform kernel, ours);
        ``"auto"`` = the paper's rule for this kernel (``paper_remask``).
        """
        mode = self.paper_remask if mode == "auto" else mode
        if mode == "random" or confidence is None:
            return self.corrupt(tokens, s, generator)
        return self._replace(tokens, least_confident(confidence, s), generator)


class UniformKernel(_TokenKernel):
    """Replace each token, with probability ``s``, by a token drawn uniformly from the vocabulary."""

    def prior(self, shape: tuple[int, ...], generator: torch.Generator | None = None, device="cpu") -> torch.Tensor:
        """``k_T``: uniform random tokens."""
        return self.random_tokens(shape, generator, device)

    def _replace(self, tokens: torch.Tensor, hit: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        return torch.where(hit, self.random_tokens(tuple(tokens.shape), generator, tokens.device), tokens)

    def transition(self, s: float) -> torch.Tensor:
        """``Q[i, j] = q(k_s = j | k_0 = i)`` in float64: ``(1 - s) I + s / V``."""
        return (1 - s) * torch.eye(self.vocab, dtype=torch.float64) + s / self.vocab


class AbsorbingKernel(_TokenKernel):
    """Replace each token, with probability ``s``, by [MASK] (id ``vocab``)."""

    paper_remask = "confidence"

    @property
    def mask_id(self) -> int:
        return self.vocab

    def prior(self, shape: tuple[int, ...], generator: torch.Generator | None = None, device="cpu") -> torch.Tensor:
        """``k_T``: all [MASK]."""
        return torch.full(shape, self.mask_id, dtype=torch.long, device=device)

    def _replace(self, tokens: torch.Tensor, hit: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        return tokens.masked_fill(hit, self.mask_id)

    def transition(self, s: float) -> torch.Tensor:
        """``Q[i, j]`` over ``V + 1`` states (the last is [MASK], which is absorbing)."""
        q = torch.zeros(self.vocab + 1, self.vocab + 1, dtype=torch.float64)
        q[: self.vocab, : self.vocab] = (1 - s) * torch.eye(self.vocab, dtype=torch.float64)
        q[:, self.mask_id] = s
        q[self.mask_id, self.mask_id] = 1.0
        return q


def least_confident(confidence: torch.Tensor, s: float) -> torch.Tensor:
    """Boolean ``[B, L]``: the ``round(s L)`` positions of each row with the lowest ``confidence``."""
    n_hit = int(round(s * confidence.shape[1]))
    hit = torch.zeros(confidence.shape, dtype=torch.bool, device=confidence.device)
    if n_hit:
        hit.scatter_(1, confidence.to(torch.float64).topk(n_hit, dim=1, largest=False).indices, True)
    return hit


def noisy_token_probs(clean_probs: torch.Tensor, kernel: UniformKernel | AbsorbingKernel, s: float) -> torch.Tensor:
    """``p(k_s | x) = sum_k0 p(k0 | x) q(k_s | k0)``: the clean head composed with the known kernel."""
    q = kernel.transition(s)
    return clean_probs.to(torch.float64) @ q[: clean_probs.shape[-1]]


def make_kernel(name: str, vocab: int) -> UniformKernel | AbsorbingKernel:
    if name == "uniform":
        return UniformKernel(vocab)
    if name == "absorbing":
        return AbsorbingKernel(vocab)
    raise DihalValueError(f"kernel must be 'uniform' or 'absorbing', got {name!r}")
