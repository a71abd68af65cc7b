"""Noise schedules and parameterisations of a Gaussian diffusion ``z_t = alpha(t) x0 + sigma(t) eps``.

Time runs from ``t = 0`` (data) to ``t = 1`` (noise). A schedule gives ``alpha``, ``sigma`` and their time
derivatives; a :class:`Prediction` says what the network outputs (``eps``, ``x0`` or the velocity
``dz/dt = alpha' x0 + sigma' eps``) and converts that output back to ``(x0, eps)`` for any schedule, so
samplers never need to know which parameterisation a model was trained with.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor

from dihal_fast.errors import DihalValueError

PREDICTIONS = ("eps", "x0", "velocity")


class NoiseSchedule(ABC):
    """``alpha(t)``, ``sigma(t)`` and ``d/dt`` of both, for ``t`` in ``[0, 1]`` (any tensor shape)."""

    name: str

    @abstractmethod
    def alpha_sigma(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """``(alpha(t), sigma(t))`` elementwise."""

    @abstractmethod
    def derivatives(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """``(d alpha / dt, d sigma / dt)`` elementwise."""

    def noise(self, x0: Tensor, t: Tensor, eps: Tensor) -> Tensor:
        """``z_t = alpha(t) x0 + sigma(t) eps`` for per-example times ``t[B]`` (or one 0-d time), in ``x0``'s dtype."""
        t = t.reshape(-1, *([1] * (x0.dim() - 1))).to(x0.dtype)
        alpha, sigma = self.alpha_sigma(t)
        return alpha * x0 + sigma * eps


class CosineSchedule(NoiseSchedule):
    """Variance-preserving cosine schedule, ``alpha = cos(u)``, ``sigma = sin(u)``, ``u = a t + b``.

    ``a`` and ``b`` clip the log-SNR ``-2 log tan(u)`` to ``[logsnr_min, logsnr_max]`` so that
    ``alpha(1) > 0`` (eps-prediction stays invertible) and ``sigma(0) > 0``.
    """

    name = "cosine"

    def __init__(self, logsnr_min: float = -10.0, logsnr_max: float = 10.0):
        if not logsnr_min < logsnr_max:
            raise DihalValueError(f"need logsnr_min < logsnr_max, got {logsnr_min} and {logsnr_max}")
        self.b = math.atan(math.exp(-0.5 * logsnr_max))
        self.a = math.atan(math.exp(-0.5 * logsnr_min)) - self.b

    def alpha_sigma(self, t: Tensor) -> tuple[Tensor, Tensor]:
        u = self.a * t + self.b
        return torch.cos(u), torch.sin(u)

    def derivatives(self, t: Tensor) -> tuple[Tensor, Tensor]:
        u = self.a * t + self.b
        return -self.a * torch.sin(u), self.a * torch.cos(u)

    def logsnr(self, t: Tensor) -> Tensor:
        return -2.0 * torch.log(torch.tan(self.a * t + self.b))


class FlowSchedule(NoiseSchedule):
    """Rectified flow / flow matching: the straight path ``z_t = (1 - t) x0 + t eps``."""

    name = "flow"

    def alpha_sigma(self, t: Tensor) -> tuple[Tensor, Tensor]:
        return 1.0 - t, t

    def derivatives(self, t: Tensor) -> tuple[Tensor, Tensor]:
        return -torch.ones_like(t), torch.ones_like(t)

    @staticmethod
    def euler_step(z: Tensor, x0_hat: Tensor, step: int) -> Tensor:
        """``z`` at level ``(step - 1) / N`` from level ``step / N`` of ``N`` equal steps, given ``x0_hat``:
        ``z - (z - x0_hat) / step`` (the Euler step of the ODE with velocity ``(z - x0_hat) / t``; on this
        straight path it equals the deterministic DDIM step, and it needs no ``N``)."""
        if step < 1:
            raise DihalValueError(f"Euler steps run from step = N down to 1, got step={step}")
        return z - (z - x0_hat) / step


SCHEDULES = {"cosine": CosineSchedule, "flow": FlowSchedule}


def make_schedule(name: str) -> NoiseSchedule:
    """The schedule called ``name`` (one of :data:`SCHEDULES`)."""
    if name not in SCHEDULES:
        raise DihalValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {name!r}")
    return SCHEDULES[name]()


@dataclass(frozen=True)
class Prediction:
    """What the denoiser outputs: ``eps``, ``x0`` or ``velocity`` (``dz/dt``; ``eps - x0`` for flow)."""

    kind: str

    def __post_init__(self) -> None:
        if self.kind not in PREDICTIONS:
            raise DihalValueError(f"prediction must be one of {PREDICTIONS}, got {self.kind!r}")

    def check_schedule(self, schedule: NoiseSchedule) -> None:
        """Reject pairs that cannot be inverted on all of ``[0, 1]``: eps with ``alpha(1) = 0``."""
        alpha_end, _ = schedule.alpha_sigma(torch.ones(()))
        if self.kind == "eps" and float(alpha_end) == 0.0:
            raise DihalValueError(
                f"eps-prediction cannot recover x0 where alpha(t) = 0 (t = 1 of the {schedule.name!r} "
                "schedule); use prediction 'velocity' or 'x0' with it"
            )

    def target(self, x0: Tensor, eps: Tensor, t: Tensor, schedule: NoiseSchedule) -> Tensor:
        """The regression target for ``z_t = alpha x0 + sigma eps``; ``t`` broadcasts against ``x0``."""
        if self.kind == "eps":
            return eps
        if self.kind == "x0":
            return x0
        d_alpha, d_sigma = schedule.derivatives(t)
        return d_alpha * x0 + d_sigma * eps

    def to_x0(self, output: Tensor, z: Tensor, t: Tensor, schedule: NoiseSchedule) -> Tensor:
        """``x0_hat`` alone (all the last sampler step needs; free for x0-prediction)."""
        return output if self.kind == "x0" else self.to_x0_eps(output, z, t, schedule)[0]

    def to_x0_eps(self, output: Tensor, z: Tensor, t: Tensor, schedule: NoiseSchedule) -> tuple[Tensor, Tensor]:
        """``(x0_hat, eps_hat)`` implied by the network ``output`` at ``(z, t)``."""
        alpha, sigma = schedule.alpha_sigma(t)
        if self.kind == "eps":
            return (z - sigma * output) / alpha, output
        if self.kind == "x0":
            return output, (z - alpha * output) / sigma
        d_alpha, d_sigma = schedule.derivatives(t)
        det = d_sigma * alpha - sigma * d_alpha
        return (d_sigma * z - sigma * output) / det, (alpha * output - d_alpha * z) / det
