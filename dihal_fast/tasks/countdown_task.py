"""Countdown as a character-level token task.

Context: the problem text ``n1,...,nk,target`` as characters of ``0-9`` and ``,`` (right-padded).
Target: the solution text ``a op b=c,...`` as characters of ``0-9+-*/=,`` followed by padding.
"""

from __future__ import annotations

import random

import torch

from dihal_fast.errors import DihalValueError
from dihal_fast.tasks.base import EvalExample, TaskSpec, stack_pairs
from dihal_fast.tasks.countdown import (
    COUNTS,
    Problem,
    check_loose,
    check_strict,
    generate,
    shortest_solution,
    true_step_share,
)

TARGET_CHARS = "0123456789+-*/=,"
CONTEXT_CHARS = "0123456789,"
TARGET_PAD = len(TARGET_CHARS)
CONTEXT_PAD = len(CONTEXT_CHARS)


def default_target_len(max_numbers: int) -> int:
    """Room for ``max_numbers - 1`` steps of up to 11 characters plus commas."""
    return 12 * (max_numbers - 1)


class CountdownTask:
    """Training problems are generated on the fly with 3-5 numbers on training (not held-out) targets."""

    def __init__(self, numbers: tuple[int, ...] = (3, 4), target_len: int | None = None) -> None:
        if not numbers or any(not COUNTS[0] <= k <= COUNTS[1] for k in numbers):
            raise DihalValueError(f"Countdown numbers per problem must be {COUNTS[0]}-{COUNTS[1]}, got {numbers}")
        self.numbers = tuple(sorted(set(numbers)))
        self.context_len = 3 * (max(self.numbers) + 1)
        target_len = target_len or default_target_len(max(self.numbers))
        if target_len < shortest_solution(max(self.numbers)):
            raise DihalValueError(
                f"--countdown-len {target_len} cannot hold a solution with {max(self.numbers)} numbers (the "
                f"shortest has {shortest_solution(max(self.numbers))} characters); use 0 for the default"
            )
        self.spec = TaskSpec(
            "countdown",
            target_vocab=len(TARGET_CHARS) + 1,
            target_len=target_len,
            context_vocab=len(CONTEXT_CHARS) + 1,
            context_len=self.context_len,
        )

    def encode_problem(self, problem: Problem) -> list[int]:
        text = problem.text()
        if len(text) > self.context_len:
            raise DihalValueError(f"problem {text!r} is longer than this model's {self.context_len}-character context")
        return [CONTEXT_CHARS.index(ch) for ch in text] + [CONTEXT_PAD] * (self.context_len - len(text))

    def encode_solution(self, solution: str) -> list[int]:
        if len(solution) > self.spec.target_len:
            raise DihalValueError(f"solution {solution!r} is longer than {self.spec.target_len} characters")
        return [TARGET_CHARS.index(ch) for ch in solution] + [TARGET_PAD] * (self.spec.target_len - len(solution))

    def train_batch(self, rng: random.Random, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = []
        for _ in range(batch_size):
            problem, solution = generate(rng, rng.choice(self.numbers), max_len=self.spec.target_len)
            pairs.append((self.encode_problem(problem), self.encode_solution(solution)))
        return stack_pairs(pairs)

    def example(self, problem: Problem, group: str) -> EvalExample:
        return EvalExample(tuple(self.encode_problem(problem)), problem, group)

    def render(self, target: list[int]) -> str:
        """The characters before the first padding token."""
        out = []
        for v in target:
            if v >= TARGET_PAD:
                break
            out.append(TARGET_CHARS[v])
        return "".join(out)

    def score(self, example: EvalExample, target: list[int]) -> dict[str, float]:
        """``correct`` = strict (each number used once), ``loose`` = steps true and final = target,
        ``true_steps`` = share of written steps that are arithmetically true."""
        text = self.render(target)
        return {
            "correct": check_strict(example.payload, text),
            "loose": check_loose(example.payload, text),
            "true_steps": true_step_share(text),
        }
