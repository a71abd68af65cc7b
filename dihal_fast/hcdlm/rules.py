"""The task-rule verifier of best-of-K (``SampleConfig.verifier = "rules"``): a finished answer scored by the puzzle's
own rules, the same for every model kind and without a network pass. A score of 0 breaks no rule (Sudoku: a valid
board that keeps the givens; Countdown: a strictly correct solution); the more broken, the lower.

- Sudoku: minus (the digits missing from each row, column and box, summed over the ``3 n`` units, plus the given
  cells the answer overwrites): :func:`sudoku_rule_breaks`;
- Countdown: minus (the operands that are neither a given number nor an earlier result, each used once; the false
  steps; the numbers left unused; plus ``d / (1 + d)`` for the distance ``d`` of the last result from the target), and
  ``-inf`` for text that is not a list of steps ``a op b=c``: :func:`countdown_rule_score`.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from dihal_fast.errors import DihalValueError
from dihal_fast.tasks.base import Task
from dihal_fast.tasks.countdown import Problem, apply_op, parse_problem, parse_steps
from dihal_fast.tasks.countdown_task import CONTEXT_CHARS, CONTEXT_PAD, CountdownTask
from dihal_fast.tasks.sudoku import Geometry
from dihal_fast.tasks.sudoku_task import SudokuTask

RULE_TASKS = ("sudoku", "countdown")  # the tasks whose answers the rules verifier can check


def sudoku_rule_breaks(geo: Geometry, puzzle: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """``[B]`` int64: per board, the digits missing from its rows, columns and boxes (one per digit a unit lacks, so
    a unit with one digit twice counts 1) plus the given cells it changes. ``puzzle[B, n*n]``: 0 = blank, ``1..n``
    the givens; ``grid[B, n*n]``: the answer's digits ``1..n`` (anything else fills no digit)."""
    units = torch.tensor(geo.units, device=grid.device)  # [3n, n] cell indices
    cells = grid.clamp(0, geo.n + 1)[:, units]  # [B, 3n, n]; 0 and n + 1: no digit
    present = torch.zeros((*cells.shape[:2], geo.n + 2), dtype=torch.bool, device=grid.device)
    present.scatter_(2, cells, True)
    missing = geo.n * units.shape[0] - present[..., 1 : geo.n + 1].sum(dim=(1, 2))
    return missing + ((puzzle > 0) & (puzzle != grid)).sum(dim=1)


def countdown_rule_score(problem: Problem, text: str) -> float:
    """``0`` for a strictly correct solution (:func:`~dihal_fast.tasks.countdown.check_strict`), else minus its
    broken rules (an operand not available, a false step, a number left unused: 1 each) minus ``d / (1 + d)`` for
    the distance ``d`` of the last result from the target; ``-inf`` when ``text`` is not a list of steps."""
    steps = parse_steps(text)
    if not steps:
        return -math.inf
    pool, breaks = Counter(problem.nums), 0
    for a, op, b, c in steps:
        for operand in (a, b):
            if pool[operand] > 0:
                pool[operand] -= 1
            else:
                breaks += 1
        breaks += apply_op(a, op, b) != c
        pool[c] += 1
    answer = steps[-1][3]
    pool[answer] -= 1  # the answer is the one number left
    distance = abs(answer - problem.target)
    return -(breaks + sum(pool.values()) + distance / (1 + distance))


def countdown_problem(context: list[int]) -> Problem:
    """The problem an encoded Countdown context (:class:`~dihal_fast.tasks.countdown_task.CountdownTask`) holds."""
    return parse_problem("".join(CONTEXT_CHARS[v] for v in context if v < CONTEXT_PAD))


def rule_scores(task: Task, context: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``[B]`` float64 rule scores (module doc) of the answers ``tokens[B, L]`` to the problems ``context[B, C]``."""
    if isinstance(task, SudokuTask):
        return -sudoku_rule_breaks(task.geo, context, tokens + 1).to(torch.float64)
    if isinstance(task, CountdownTask):
        scores = [
            countdown_rule_score(countdown_problem(row), task.render(answer))
            for row, answer in zip(context.tolist(), tokens.tolist())
        ]
        return torch.tensor(scores, dtype=torch.float64, device=tokens.device)
    raise DihalValueError(
        f"--verifier rules checks the rules of {' and '.join(RULE_TASKS)} answers; a {task.spec.name} run has none: "
        "use --verifier chain"
    )
