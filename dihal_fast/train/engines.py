"""Two training engines behind one interface: a plain torch loop and DeepSpeed ZeRO.

An engine owns the objective module, the optimizer (torch AdamW over the trainable parameters only) and
the LR schedule (linear warm-up, cosine decay to a tenth). ``engine(**inputs)`` runs the objective,
``backward(loss)`` and ``step()`` update (with gradient clipping), ``save(dir)`` / ``load(dir)`` hold the
engine's part of a checkpoint, ``full_parameters()`` yields the trainable parameters with their full
values (ZeRO-3 gathers them), ``barrier()`` waits for the other processes.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dihal_fast.train.config import TrainConfig


def make_optimizer(parameters: list[nn.Parameter], config: TrainConfig) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """Torch AdamW (no compiled op needed anywhere) and the warm-up + cosine schedule."""
    optimizer = torch.optim.AdamW(parameters, lr=config.lr, weight_decay=config.weight_decay)

    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / (config.warmup_steps + 1)
        progress = min(1.0, (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def trainable_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` pairs that require gradients, in module order."""
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


def load_checked(path: Path, loader):
    """``loader(path)`` with a clear error when the file is missing or unreadable (a corrupt checkpoint)."""
    if not path.is_file():
        raise ValueError(f"checkpoint file missing: {path}")
    try:
        return loader(path)
    except Exception as exc:  # torch/safetensors raise many types for damaged files
        raise ValueError(f"checkpoint file {path} is corrupt or unreadable: {type(exc).__name__}: {exc}") from None


class TorchEngine:
    """Single-process training with ``torch.optim.AdamW``."""

    kind = "torch"
    rank, world_size = 0, 1

    def __init__(self, objective: nn.Module, config: TrainConfig):
        self.module, self.config = objective, config
        self.named = trainable_parameters(objective)
        self.optimizer, self.scheduler = make_optimizer([p for _, p in self.named], config)
        self.device = torch.device(config.device)

    def __call__(self, **inputs):
        return self.module(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        """Clip, update, advance the schedule, zero the gradients; returns the gradient norm before clipping."""
        parameters = [p for _, p in self.named]
        limit = self.config.grad_clip if self.config.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(parameters, limit)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[list[tuple[str, nn.Parameter]]]:
        yield self.named

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        save_file({name: p.detach().contiguous().cpu() for name, p in self.named}, str(directory / "trainable.safetensors"))
        torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}, directory / "optimizer.pt")

    def load(self, directory: Path) -> None:
        weights = load_checked(directory / "trainable.safetensors", lambda p: load_file(str(p)))
        state = load_checked(directory / "optimizer.pt", lambda p: torch.load(p, map_location="cpu", weights_only=True))
        names = [name for name, _ in self.named]
        if sorted(weights) != sorted(names):
            raise ValueError(f"checkpoint {directory} holds parameters {sorted(weights)[:4]}..., not this run's {names[:4]}...")
        with torch.no_grad():
            for name, p in self.named:
                p.copy_(weights[name])
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        except (KeyError, ValueError, RuntimeError) as exc:
            raise ValueError(f"optimizer state in {directory} does not fit this run: {exc}") from None

    def barrier(self) -> None:
        """Nothing to wait for in one process."""
