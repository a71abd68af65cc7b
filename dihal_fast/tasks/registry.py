"""One place that builds a task from its saved configuration."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from dihal_fast.tasks.countdown_task import CountdownTask
from dihal_fast.tasks.sudoku_task import SudokuTask, generate_pool, parse_box
from dihal_fast.common.models import load_tokenizer
from dihal_fast.tasks.text_task import TextTask, tokenize_files

logger = logging.getLogger(__name__)
TASKS = ("sudoku", "countdown", "text")


@dataclass
class TaskConfig:
    """Everything needed to rebuild a task (saved in every run's config)."""

    name: str = "sudoku"
    sudoku_box: str = "2x3"  # 6x6: learnable in CPU-minutes; "3x3" is the paper's 9x9 (GPU scale)
    sudoku_pool: int = 3000
    sudoku_train_difficulty: str = "singles"
    countdown_numbers: list[int] = field(default_factory=lambda: [3, 4])
    countdown_target_len: int = 0  # 0 = room for the largest problem
    text_files: list[str] = field(default_factory=list)
    text_len: int = 64
    text_max_chars: int = 0  # 0 = whole files
    tokenizer_dir: str = ""

    def __post_init__(self) -> None:
        if self.name not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.name!r}")


def build_task(cfg: TaskConfig, run_dir: Path | None = None, seed: int = 0, for_training: bool = True):
    """The task object; with ``for_training`` also its training data (pool / corpus)."""
    if cfg.name == "sudoku":
        rows, cols = parse_box(cfg.sudoku_box)
        task = SudokuTask(rows, cols)
        if for_training:
            cache = run_dir / "puzzle_pool.json" if run_dir is not None else None
            task.pool = generate_pool(task.geo, cfg.sudoku_pool, cfg.sudoku_train_difficulty, seed, cache)
        return task
    if cfg.name == "countdown":
        return CountdownTask(tuple(cfg.countdown_numbers), cfg.countdown_target_len or None)
    if not cfg.tokenizer_dir:
        raise ValueError("the text task needs a tokenizer directory (the shipped backbone or --backbone DIR)")
    tokenizer = load_tokenizer(cfg.tokenizer_dir)
    tokens = None
    if for_training:
        if not cfg.text_files:
            raise ValueError("the text task needs training files (--text-files)")
        tokens = tokenize_files(tokenizer, [Path(f) for f in cfg.text_files], cfg.text_max_chars or None)
        logger.info("text corpus: %d tokens from %d files", len(tokens), len(cfg.text_files))
    return TextTask(tokenizer, cfg.text_len, tokens)
