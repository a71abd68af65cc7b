"""Samplers: from noise ``z_1`` to a clean sample ``x0``, given a model, a schedule and a prediction type.

A model here is any callable ``model(z, t) -> output`` with ``t`` a 0-d tensor (one time for all
positions). Every sampler walks the uniform time grid ``1 = t_0 > ... > t_N = 0`` and returns the model's
``x0`` estimate at the last grid point before 0, so ``nfe`` evaluations (DDPM, DDIM, Euler) or
``2N - 1`` with ``N = (nfe + 1) // 2`` steps (Heun) are spent, and an exact model gives back the exact
``x0`` whatever ``nfe``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import Tensor

from dihal_fast.bridge.schedules import NoiseSchedule, Prediction
from dihal_fast.errors import DihalValueError

Model = Callable[[Tensor, Tensor], Tensor]


def time_grid(steps: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Tensor:
    """``steps + 1`` equally spaced times from 1 down to 0."""
    return torch.linspace(1.0, 0.0, steps + 1, dtype=dtype, device=device)


def _denoise(
    model: Model, schedule: NoiseSchedule, prediction: Prediction, z: Tensor, t: Tensor
) -> tuple[Tensor, Tensor]:
    return prediction.to_x0_eps(model(z, t), z, t, schedule)


class Sampler(ABC):
    """Draws ``x0`` from ``z`` (the initial noise); ``noise`` holds the fresh draws of stochastic samplers."""

    name: str
    stochastic = False

    def steps(self, nfe: int) -> int:
        """Grid steps that fit in ``nfe`` model evaluations."""
        if nfe < 1:
            raise DihalValueError(f"nfe must be >= 1, got {nfe}")
        return nfe

    def sample(
        self,
        model: Model,
        schedule: NoiseSchedule,
        prediction: Prediction,
        z: Tensor,
        nfe: int,
        noise: Tensor | None = None,
    ) -> Tensor:
        """``x0`` of the shape of ``z``; ``noise`` is ``(steps - 1, *z.shape)`` for stochastic samplers."""
        steps = self.steps(nfe)
        if self.stochastic and steps > 1 and (noise is None or noise.shape[0] < steps - 1):
            raise DihalValueError(f"{self.name} with nfe={nfe} needs {steps - 1} noise draws of shape {tuple(z.shape)}")
        grid = time_grid(steps, z.dtype, z.device)
        for k in range(steps - 1):
            x0, eps = _denoise(model, schedule, prediction, z, grid[k])
            z = self.move(
                model, schedule, prediction, z, x0, eps, grid[k], grid[k + 1], noise[k] if self.stochastic else None
            )
        return prediction.to_x0(model(z, grid[steps - 1]), z, grid[steps - 1], schedule)

    @abstractmethod
    def move(
        self,
        model: Model,
        schedule: NoiseSchedule,
        prediction: Prediction,
        z: Tensor,
        x0: Tensor,
        eps: Tensor,
        t: Tensor,
        s: Tensor,
        noise: Tensor | None,
    ) -> Tensor:
        """``z_s`` from ``z_t`` (``s < t``) given the model's estimates ``x0``, ``eps`` at ``(z, t)``."""


class DDIM(Sampler):
    """DDIM with stochasticity ``eta`` (0: deterministic; 1: the DDPM ancestral posterior)."""

    name = "ddim"

    def __init__(self, eta: float = 0.0):
        if not 0.0 <= eta <= 1.0:
            raise DihalValueError(f"eta must lie in [0, 1], got {eta}")
        self.eta = eta
        self.stochastic = eta > 0

    def move(self, model, schedule, prediction, z, x0, eps, t, s, noise):
        alpha_t, sigma_t = schedule.alpha_sigma(t)
        alpha_s, sigma_s = schedule.alpha_sigma(s)
        # eta times the std of q(z_s | z_t, x0); (alpha_t sigma_s) / (alpha_s sigma_t) <= 1 for these schedules.
        ratio = (alpha_t * sigma_s) / (alpha_s * sigma_t)
        c = self.eta * sigma_s * torch.sqrt(torch.clamp(1.0 - ratio * ratio, min=0.0))
        z = alpha_s * x0 + torch.sqrt(torch.clamp(sigma_s**2 - c**2, min=0.0)) * eps
        return z + c * noise if self.stochastic else z


class DDPM(DDIM):
    """Ancestral sampling from the DDPM posterior (DDIM with ``eta = 1``)."""

    name = "ddpm"

    def __init__(self):
        super().__init__(eta=1.0)


def _velocity(schedule: NoiseSchedule, x0: Tensor, eps: Tensor, t: Tensor) -> Tensor:
    d_alpha, d_sigma = schedule.derivatives(t)
    return d_alpha * x0 + d_sigma * eps


class Euler(Sampler):
    """Euler steps on the probability-flow ODE ``dz/dt = alpha' x0_hat + sigma' eps_hat``."""

    name = "euler"

    def move(self, model, schedule, prediction, z, x0, eps, t, s, noise):
        return z + (s - t) * _velocity(schedule, x0, eps, t)


class Heun(Sampler):
    """Heun's second-order method on the same ODE (as in EDM); ``N`` steps cost ``2N - 1`` evaluations."""

    name = "heun"

    def steps(self, nfe: int) -> int:
        return (super().steps(nfe) + 1) // 2

    def move(self, model, schedule, prediction, z, x0, eps, t, s, noise):
        v1 = _velocity(schedule, x0, eps, t)
        x0_e, eps_e = _denoise(model, schedule, prediction, z + (s - t) * v1, s)
        return z + 0.5 * (s - t) * (v1 + _velocity(schedule, x0_e, eps_e, s))


SAMPLERS: dict[str, type[Sampler]] = {"ddpm": DDPM, "ddim": DDIM, "euler": Euler, "heun": Heun}


def make_sampler(name: str) -> Sampler:
    """The sampler called ``name`` (one of :data:`SAMPLERS`); DDIM is deterministic (``eta = 0``)."""
    if name not in SAMPLERS:
        raise DihalValueError(f"sampler must be one of {sorted(SAMPLERS)}, got {name!r}")
    return SAMPLERS[name]()
