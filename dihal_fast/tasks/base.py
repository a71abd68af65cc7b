"""What every task gives the diffusion models: a fixed-size token interface and a scorer.

A task turns its examples into two integer sequences: a *context* (the given puzzle, the Countdown
numbers; empty for unconditional text) and a *target* of ``target_len`` tokens in ``[0, target_vocab)``
that the model generates. ``aligned`` says context position ``i`` describes target position ``i``
(Sudoku), so models may add the two embeddings instead of concatenating the sequences.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from dihal_fast.errors import DihalValueError


@dataclass(frozen=True)
class TaskSpec:
    """Sizes of a task's token interface."""

    name: str
    target_vocab: int
    target_len: int
    context_vocab: int = 0
    context_len: int = 0
    aligned: bool = False
    # Structure of the target slots: each labelling gives every slot a group id (Sudoku: its row, its
    # column, its box). Models embed the labels next to the free positions, so cells of one unit share
    # a feature from the first step instead of discovering the grid from data.
    slot_groups: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.target_vocab < 2 or self.target_len < 1:
            raise DihalValueError(
                f"target_vocab must be >= 2 and target_len >= 1, got {self.target_vocab}, {self.target_len}"
            )
        if self.aligned and self.context_len != self.target_len:
            raise DihalValueError(
                f"an aligned context must have target_len={self.target_len} tokens, got {self.context_len}"
            )
        if any(len(labels) != self.target_len or min(labels) < 0 for labels in self.slot_groups):
            raise DihalValueError(f"every slot labelling needs {self.target_len} non-negative group ids")


@dataclass(frozen=True)
class EvalExample:
    """One evaluation item: its encoded context, what the scorer needs, and its report group."""

    context: tuple[int, ...]
    payload: Any
    group: str


class Task(Protocol):
    """The interface the HC-DLM harness uses; implemented by the Sudoku, Countdown and text tasks."""

    spec: TaskSpec

    def train_batch(self, rng: random.Random, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(context (B, context_len), target (B, target_len))`` int64 tensors of training examples."""

    def score(self, example: EvalExample, target: list[int]) -> dict[str, float]:
        """Named scores in [0, 1] of a generated target (``correct`` at least, for puzzle tasks)."""

    def render(self, target: list[int]) -> str:
        """Human-readable form of a generated target."""


def stack_pairs(pairs: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ``[(context, target), ...]`` into two int64 tensors."""
    contexts = torch.tensor([c for c, _ in pairs], dtype=torch.long)
    targets = torch.tensor([t for _, t in pairs], dtype=torch.long)
    return contexts.reshape(len(pairs), -1), targets
