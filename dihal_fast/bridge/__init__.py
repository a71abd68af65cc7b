"""The conditional diffusion bridge ``c(x) -> h_l``: model, noise schedules, parameterisations, samplers."""

from dihal_fast.bridge.model import Bridge, BridgeCache, BridgeConfig, position_noise
from dihal_fast.bridge.samplers import DDIM, DDPM, SAMPLERS, Euler, Heun, Sampler, make_sampler, time_grid
from dihal_fast.bridge.schedules import (
    PREDICTIONS,
    SCHEDULES,
    CosineSchedule,
    FlowSchedule,
    NoiseSchedule,
    Prediction,
    make_schedule,
)

__all__ = [
    "Bridge",
    "BridgeCache",
    "BridgeConfig",
    "position_noise",
    "DDIM",
    "DDPM",
    "Euler",
    "Heun",
    "SAMPLERS",
    "Sampler",
    "make_sampler",
    "time_grid",
    "PREDICTIONS",
    "SCHEDULES",
    "CosineSchedule",
    "FlowSchedule",
    "NoiseSchedule",
    "Prediction",
    "make_schedule",
]
