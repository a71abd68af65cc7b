"""Sudoku as a token task: context = the puzzle (0 = empty), target = the solution's digits minus one."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import torch

from dihal_fast.common import atomic_write_json, read_json
from dihal_fast.common.progress import progress_bar
from dihal_fast.errors import DihalValueError
from dihal_fast.tasks.base import EvalExample, TaskSpec, stack_pairs
from dihal_fast.tasks.sudoku import (
    Geometry,
    blank_cell_accuracy,
    format_grid,
    geometry,
    is_valid_solution,
    random_symmetry,
)
from dihal_fast.tasks.sudoku_grade import generate

logger = logging.getLogger(__name__)

Pair = tuple[tuple[int, ...], tuple[int, ...]]


def parse_box(text: str) -> tuple[int, int]:
    """``"3x3"`` -> ``(3, 3)``; ValueError otherwise."""
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise DihalValueError(f"box shape must look like '3x3' or '2x3', got {text!r}") from None
    geometry(rows, cols)
    return rows, cols


# Draws in a row that give no new puzzle before the pool is declared impossible to fill.
POOL_PATIENCE = 1000


def generate_pool(geo: Geometry, count: int, difficulty: str, seed: int, cache: Path | None = None) -> list[Pair]:
    """``count`` distinct generated puzzles of one grade, cached as JSON so a resumed run reuses them.

    A grid with fewer distinct puzzles than ``count`` (e.g. 1x2 boxes) is a ``ValueError`` after
    :data:`POOL_PATIENCE` draws in a row without a new one, never a hang."""
    if cache is not None and cache.is_file():
        return checked_pool(read_json(cache, "puzzle pool"), geo, count, cache)
    rng, seen, pool, misses = random.Random(seed), set(), [], 0
    with progress_bar(total=count, desc=f"generating {difficulty} {geo.n}x{geo.n} puzzles", leave=False) as bar:
        while len(pool) < count:
            puzzle, solution = generate(rng, geo, difficulty)
            misses = misses + 1 if puzzle in seen else 0
            if misses >= POOL_PATIENCE:
                raise DihalValueError(
                    f"only {len(pool)} distinct {difficulty} {geo.n}x{geo.n} puzzles found ({POOL_PATIENCE} "
                    f"draws in a row gave no new one); lower --sudoku-pool to at most {len(pool)} or use a "
                    "larger box"
                )
            if puzzle not in seen:
                seen.add(puzzle)
                pool.append((puzzle, solution))
                bar.update()
    if cache is not None:
        atomic_write_json(cache, [[list(p), list(s)] for p, s in pool])
    return pool


def checked_pool(data: object, geo: Geometry, count: int, path: Path) -> list[Pair]:
    """The pool saved in ``path``, or a ``ValueError`` naming it unless it holds ``count`` valid puzzle/solution
    pairs."""

    def bad(what: str) -> ValueError:
        return DihalValueError(f"puzzle pool {path} is damaged: {what}; delete it to generate the pool again")

    if not isinstance(data, list) or len(data) != count:
        found = f"{len(data)} entries" if isinstance(data, list) else f"a JSON {type(data).__name__}"
        raise bad(f"expected a list of {count} [puzzle, solution] pairs, got {found}")
    pool = []
    for index, entry in enumerate(data):
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and all(
                isinstance(grid, list) and len(grid) == geo.cells and all(type(v) is int for v in grid)
                for grid in entry
            )
        ):
            raise bad(f"entry {index} is not a pair of {geo.cells}-cell integer grids")
        puzzle, solution = tuple(entry[0]), tuple(entry[1])
        if any(not 0 <= v <= geo.n for v in puzzle) or not is_valid_solution(puzzle, solution, geo):
            raise bad(f"entry {index} is not a {geo.n}x{geo.n} puzzle with its solution")
        pool.append((puzzle, solution))
    return pool


class SudokuTask:
    """Training draws a pooled puzzle and applies a random symmetry, so the model sees many variants."""

    def __init__(self, box_rows: int = 3, box_cols: int = 3, pool: list[Pair] | None = None) -> None:
        self.geo = geometry(box_rows, box_cols)
        n = self.geo.n
        cells = range(self.geo.cells)
        groups = (tuple(c // n for c in cells), tuple(c % n for c in cells), tuple(self.geo.box_of(c) for c in cells))
        self.spec = TaskSpec(
            "sudoku",
            target_vocab=n,
            target_len=n * n,
            context_vocab=n + 1,
            context_len=n * n,
            aligned=True,
            slot_groups=groups,
        )
        self.pool = pool or []

    def encode(self, puzzle: tuple[int, ...], solution: tuple[int, ...] | None = None) -> tuple[list[int], list[int]]:
        if len(puzzle) != self.geo.cells:
            raise DihalValueError(
                f"this model solves {self.geo.n}x{self.geo.n} Sudoku ({self.geo.cells} cells), got {len(puzzle)} cells"
            )
        target = [v - 1 for v in solution] if solution is not None else [0] * self.geo.cells
        return list(puzzle), target

    def train_batch(self, rng: random.Random, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.pool:
            raise DihalValueError("the Sudoku task has no training pool")
        pairs = [self.encode(*random_symmetry(*rng.choice(self.pool), rng, self.geo)) for _ in range(batch_size)]
        return stack_pairs(pairs)

    def example(self, puzzle: tuple[int, ...], solution: tuple[int, ...], group: str) -> EvalExample:
        return EvalExample(tuple(self.encode(puzzle)[0]), (puzzle, solution), group)

    def grid(self, target: list[int]) -> tuple[int, ...]:
        return tuple(int(v) + 1 for v in target)

    def score(self, example: EvalExample, target: list[int]) -> dict[str, float]:
        """``correct``: the whole board equals the reference; ``valid``: a valid grid keeping the givens;
        ``blank_cells``: share of empty cells filled correctly."""
        puzzle, solution = example.payload
        grid = self.grid(target)
        return {
            "correct": grid == tuple(solution),
            "valid": is_valid_solution(puzzle, grid, self.geo),
            "blank_cells": blank_cell_accuracy(puzzle, solution, grid),
        }

    def render(self, target: list[int]) -> str:
        return format_grid(self.grid(target), pretty=True, geo=self.geo)
