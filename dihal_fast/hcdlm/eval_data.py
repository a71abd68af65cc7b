"""Evaluation sets: the real files (Sudoku CSV, Countdown JSONL, text) and freshly generated splits."""

from __future__ import annotations

import random
from pathlib import Path

from dihal_fast.errors import DihalValueError
from dihal_fast.tasks.base import EvalExample
from dihal_fast.tasks.countdown import generate as generate_countdown
from dihal_fast.tasks.countdown_task import CountdownTask
from dihal_fast.tasks.data import detect_format, load_countdown_jsonl, load_sudoku_csv
from dihal_fast.tasks.sudoku_grade import generate as generate_sudoku
from dihal_fast.tasks.sudoku_task import SudokuTask

SPLITS = {"easy": "singles", "hard": "hard"}


def examples_from_file(task, path: str | Path, limit: int | None = None) -> list[EvalExample]:
    """Examples of a data file whose format (detected from content) must match the run's task."""
    kind = detect_format(path)
    if kind != task.spec.name:
        raise DihalValueError(f"{path} is {kind} data but the run was trained on {task.spec.name}")
    if kind == "sudoku":
        records = load_sudoku_csv(path, limit)
        if records and len(records[0].puzzle) != task.geo.cells:
            raise DihalValueError(
                f"{path} holds {len(records[0].puzzle)}-cell puzzles; the run solves {task.geo.n}x{task.geo.n} "
                f"({task.geo.cells} cells)"
            )
        return [task.example(r.puzzle, r.solution, r.level) for r in records]
    if kind == "countdown":
        return [task.example(problem, group) for problem, group in load_countdown_jsonl(path, limit)]
    raise DihalValueError(f"{path} is text; text runs are evaluated by Gen PPL, not per-example accuracy")


def text_windows(task, path: str | Path, count: int) -> list[str]:
    """``count`` evenly spaced ``target_len``-token windows of a text file, decoded (the data yardstick)."""
    from dihal_fast.tasks.text_task import tokenize_files

    tokens = tokenize_files(task.tokenizer, [Path(path)])
    length = task.spec.target_len
    if len(tokens) < length:
        raise DihalValueError(f"{path} has {len(tokens)} tokens, fewer than one {length}-token window")
    stride = max(1, (len(tokens) - length) // max(1, count))
    return [task.render(tokens[i : i + length].tolist()) for i in range(0, stride * count, stride)][:count]


def generated_sudoku(task: SudokuTask, split: str, count: int, seed: int) -> list[EvalExample]:
    """Fresh puzzles: ``easy`` = singles only (the training grade), ``hard`` = needs other strategies."""
    if split not in SPLITS:
        raise DihalValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    rng = random.Random(f"sudoku-eval-{split}-{seed}")
    return [task.example(*generate_sudoku(rng, task.geo, SPLITS[split]), split) for _ in range(count)]


def generated_countdown(task: CountdownTask, numbers: int, count: int, seed: int) -> list[EvalExample]:
    """Fresh problems with ``numbers`` numbers on held-out targets (never seen in training)."""
    rng = random.Random(f"countdown-eval-{numbers}-{seed}")
    return [
        task.example(generate_countdown(rng, numbers, held_out=True, max_len=task.spec.target_len)[0], f"cd{numbers}")
        for _ in range(count)
    ]
