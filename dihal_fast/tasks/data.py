"""Reading the real evaluation files: the Sudoku CSV and the Countdown JSONL, detected from content."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dihal_fast.errors import DihalValueError
from dihal_fast.tasks.countdown import Problem
from dihal_fast.tasks.sudoku import geometry_for_size, is_valid_solution, parse_grid


@dataclass(frozen=True)
class SudokuRecord:
    puzzle: tuple[int, ...]
    solution: tuple[int, ...]
    level: str


def detect_format(path: str | Path) -> str:
    """``"sudoku"`` (CSV with puzzle/solution columns), ``"countdown"`` (JSONL with nums/target) or ``"text"``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    with path.open(encoding="utf-8") as handle:
        first = handle.readline().strip()
    if first.startswith("{"):
        try:
            record = json.loads(first)
        except json.JSONDecodeError:
            record = {}
        if isinstance(record, dict) and {"nums", "target"} <= record.keys():
            return "countdown"
        raise DihalValueError(
            f"{path}: a JSONL data file must hold objects with 'nums' and 'target', got {first[:80]!r}"
        )
    header = {h.strip() for h in first.split(",")}
    if {"puzzle", "solution"} <= header:
        return "sudoku"
    if path.suffix == ".txt":
        return "text"
    raise DihalValueError(
        f"{path}: expected a Sudoku CSV (puzzle,solution columns), a Countdown JSONL (nums,target) or a .txt text file"
    )


def _csv_rows(path: str | Path, handle) -> Iterator[tuple[int, dict]]:
    """``(line number, row)`` of a CSV with a header; a malformed file (an unterminated quote, a field over
    the csv module's limit, a NUL byte) is one line naming the file and the row."""
    rows = csv.DictReader(handle)
    line_no = 1
    try:
        for line_no, row in enumerate(rows, start=2):
            yield line_no, row
    except csv.Error as exc:
        raise DihalValueError(f"{path}: not a readable CSV after row {line_no} ({exc})") from exc


def load_sudoku_csv(path: str | Path, limit: int | None = None) -> list[SudokuRecord]:
    """Rows of a CSV with ``puzzle`` and ``solution`` columns (``level`` optional); each row is checked."""
    records = []
    with Path(path).open(encoding="utf-8", newline="") as handle:
        for line_no, row in _csv_rows(path, handle):
            if not isinstance(row.get("puzzle"), str) or not isinstance(row.get("solution"), str):
                raise DihalValueError(f"{path}:{line_no}: expected puzzle and solution columns, got {row!r:.200}")
            try:
                puzzle, solution = parse_grid(row["puzzle"]), parse_grid(row["solution"])
            except ValueError as exc:
                raise DihalValueError(f"{path}:{line_no}: {exc}") from exc
            if not is_valid_solution(puzzle, solution, geometry_for_size(len(puzzle))):
                raise DihalValueError(f"{path}:{line_no}: the solution is not a valid grid agreeing with the puzzle")
            records.append(SudokuRecord(puzzle, solution, row.get("level") or "all"))
            if limit is not None and len(records) >= limit:
                break
    return records


def load_countdown_jsonl(path: str | Path, limit: int | None = None) -> list[tuple[Problem, str]]:
    """``[(problem, group), ...]`` from JSONL objects with integer ``nums`` and ``target``; group = ``cd<k>``."""
    problems = []
    with Path(path).open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                nums, target = record["nums"], record["target"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DihalValueError(f"{path}:{line_no}: expected a JSON object with 'nums' and 'target'") from None
            if not isinstance(nums, list) or not all(isinstance(v, int) and v > 0 for v in [*nums, target]):
                raise DihalValueError(
                    f"{path}:{line_no}: 'nums' must be a list of positive integers and 'target' one, got {nums!r}, "
                    f"{target!r}"
                )
            problems.append((Problem(tuple(nums), target), f"cd{len(nums)}"))
            if limit is not None and len(problems) >= limit:
                break
    return problems
