"""One place that builds a task from its saved configuration."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from dihal_fast.common.hf_loading import load_tokenizer
from dihal_fast.common.options import comma_integers, option
from dihal_fast.common.validation import CheckedConfig
from dihal_fast.errors import DihalValueError
from dihal_fast.tasks.countdown import COUNTS, shortest_solution
from dihal_fast.tasks.countdown_task import CountdownTask
from dihal_fast.tasks.sudoku_grade import DIFFICULTIES
from dihal_fast.tasks.sudoku_task import SudokuTask, generate_pool, parse_box
from dihal_fast.tasks.text_task import TextTask, tokenize_files

logger = logging.getLogger(__name__)
TASKS = ("sudoku", "countdown", "text")
POOL_FILE = "puzzle_pool.json"  # a Sudoku run's training pool, in its run directory


@dataclass
class TaskConfig(CheckedConfig):
    """Everything needed to rebuild a task (saved in every run's config)."""

    name: str = option("sudoku", "task to train on", flag="--task", choices=TASKS, required=True)
    # 6x6 is learnable in CPU-minutes; "3x3" is the paper's 9x9 (GPU scale).
    sudoku_box: str = option("2x3", "Sudoku box shape: 3x3 (9x9 grid), 2x3 (6x6) or 2x2 (4x4)")
    sudoku_pool: int = option(3000, "generated training puzzles (augmented by symmetries)", min=1)
    sudoku_train_difficulty: str = option(
        "singles", "grade of the training puzzles", flag="--sudoku-difficulty", choices=tuple(DIFFICULTIES)
    )
    countdown_numbers: list[int] = option(
        default_factory=lambda: [3, 4],
        help="numbers per training problem, e.g. 3,4",
        type=comma_integers,
        metavar="N,N,...",
        min=COUNTS[0],
        max=COUNTS[1],
    )
    countdown_target_len: int = option(
        0, "solution length in characters (0 = room for the largest problem)", flag="--countdown-len"
    )
    text_files: list[str] = option(
        default_factory=list,
        help="training text files of the text task; the command line's default is the shipped corpus",
        cli_default=None,
    )
    text_len: int = option(64, "tokens per text sample", min=1)
    text_max_chars: int = option(0, "read at most this many characters per file (0 = all)")
    tokenizer_dir: str = option(
        "",
        "checkpoint whose tokenizer the text task uses; the command line's default is the shipped backbone",
        flag="--backbone",
        cli_default=None,
        metavar="DIR",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        parse_box(self.sudoku_box)
        if not self.countdown_numbers:
            raise DihalValueError("--countdown-numbers must name at least one count, e.g. 3,4")
        longest = shortest_solution(max(self.countdown_numbers))
        if self.countdown_target_len and self.countdown_target_len < longest:
            raise DihalValueError(
                f"--countdown-len {self.countdown_target_len} cannot hold a solution "
                f"with {max(self.countdown_numbers)} numbers (the shortest has {longest} characters); "
                "use 0 for the default"
            )


def build_task(cfg: TaskConfig, run_dir: Path | None = None, seed: int = 0, for_training: bool = True):
    """The task object; with ``for_training`` also its training data (pool / corpus)."""
    if cfg.name == "sudoku":
        rows, cols = parse_box(cfg.sudoku_box)
        task = SudokuTask(rows, cols)
        if for_training:
            cache = run_dir / POOL_FILE if run_dir is not None else None
            task.pool = generate_pool(task.geo, cfg.sudoku_pool, cfg.sudoku_train_difficulty, seed, cache)
        return task
    if cfg.name == "countdown":
        return CountdownTask(tuple(cfg.countdown_numbers), cfg.countdown_target_len or None)
    if not cfg.tokenizer_dir:
        raise DihalValueError("the text task needs a tokenizer directory (the shipped backbone or --backbone DIR)")
    tokenizer = load_tokenizer(cfg.tokenizer_dir)
    tokens = None
    if for_training:
        if not cfg.text_files:
            raise DihalValueError("the text task needs training files (--text-files)")
        tokens = tokenize_files(tokenizer, [Path(f) for f in cfg.text_files], cfg.text_max_chars or None)
        logger.info("text corpus: %d tokens from %d files", len(tokens), len(cfg.text_files))
    return TextTask(tokenizer, cfg.text_len, tokens)
