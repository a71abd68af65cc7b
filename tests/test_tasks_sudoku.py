"""Sudoku solver, grader and generator, checked against the real Kaggle puzzles and by properties."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dihal_fast.tasks.data import load_sudoku_csv
from dihal_fast.tasks.sudoku import (
    count_solutions,
    format_grid,
    geometry,
    initial_candidates,
    is_valid_solution,
    parse_grid,
    propagate_singles,
    random_symmetry,
    solve,
    solve_all,
)
from dihal_fast.tasks.sudoku_grade import ADVANCED_STRATEGIES, generate, grade

SHAPES = [(2, 2), (2, 3), (3, 3)]


@pytest.fixture(scope="module")
def kaggle(shared_data):
    return load_sudoku_csv(shared_data / "sudoku_kaggle3m_curated5000.csv")


def test_real_puzzles_unique_and_solver_agrees(kaggle):
    """Every 5th of the 5,000 real puzzles: exactly one solution, equal to the given one (full set: slow test)."""
    assert len(kaggle) == 5000
    for record in kaggle[::5]:
        assert solve_all(record.puzzle, limit=2) == [record.solution]


@pytest.mark.slow
def test_all_real_puzzles_unique_and_solver_agrees(kaggle):
    for record in kaggle:
        assert solve_all(record.puzzle, limit=2) == [record.solution]


def test_grader_matches_kaggle_levels(kaggle):
    """'Beginner' (search depth 0 in the source) is singles-only; every other level needs more than singles."""
    for record in kaggle[::25]:
        grade_name, used = grade(record.puzzle, geometry())
        assert (grade_name == "singles") == (record.level == "Beginner"), (record.level, grade_name)
        assert bool(used) == (grade_name == "advanced") or grade_name == "search"


def _solution_kept(cands: list[int], solution: tuple[int, ...]) -> bool:
    return all(mask >> (digit - 1) & 1 for mask, digit in zip(cands, solution))


def test_strategies_never_remove_the_solution(kaggle):
    """Soundness: singles and every advanced strategy keep the true digit among each cell's candidates."""
    geo = geometry()
    for record in kaggle[1000::40]:
        cands = initial_candidates(record.puzzle, geo)
        assert propagate_singles(cands, geo) and _solution_kept(cands, record.solution)
        for _ in range(30):
            for _name, strategy in ADVANCED_STRATEGIES:
                if strategy(cands, geo):
                    break
            else:
                break
            assert _solution_kept(cands, record.solution)
            assert propagate_singles(cands, geo) and _solution_kept(cands, record.solution)


@pytest.mark.parametrize(
    "text, message",
    [
        ("1" * 80, "81 cells"),
        ("." * 80 + "x", "found 'x'"),
        ("." * 35 + "7", "found '7'"),  # 6x6 grids only hold 1-6
        ("", "16, 36 or 81"),
    ],
)
def test_malformed_puzzles_raise(text, message):
    with pytest.raises(ValueError, match=message):
        parse_grid(text, geometry() if len(text) in (80, 81) else None)


def test_contradictory_and_ambiguous_puzzles(kaggle):
    puzzle = list(kaggle[0].puzzle)
    first_given = next(i for i, v in enumerate(puzzle) if v)
    row_start = first_given - first_given % 9
    blank = next(i for i in range(row_start, row_start + 9) if puzzle[i] == 0)
    puzzle[blank] = puzzle[first_given]  # the same digit twice in one row
    assert solve_all(tuple(puzzle)) == [] and solve(tuple(puzzle)) is None
    assert count_solutions(tuple([0] * 81)) == 2
    with pytest.raises(ValueError, match="more than one solution"):
        solve(tuple([0] * 81))
    with pytest.raises(ValueError, match="contradictory"):
        grade(tuple(puzzle), geometry())


def test_format_round_trip(kaggle):
    text = format_grid(kaggle[3].puzzle)
    assert parse_grid(text) == kaggle[3].puzzle
    assert (
        parse_grid(format_grid(kaggle[3].solution, pretty=True).replace("|", "").replace("-", "")) == kaggle[3].solution
    )


@pytest.mark.parametrize("shape", SHAPES)
def test_generator_singles_unique_and_graded(shape):
    geo, rng = geometry(*shape), random.Random(1)
    for _ in range(3 if shape == (3, 3) else 10):
        puzzle, solution = generate(rng, geo, "singles")
        assert is_valid_solution(puzzle, solution, geo)
        assert solve_all(puzzle, geo, limit=2) == [solution]
        assert grade(puzzle, geo)[0] == "singles"


def test_generator_hard_needs_more_than_singles():
    geo, rng = geometry(2, 3), random.Random(2)
    for _ in range(5):
        puzzle, solution = generate(rng, geo, "hard")
        assert solve_all(puzzle, geo, limit=2) == [solution]
        assert grade(puzzle, geo)[0] in ("advanced", "search")
    with pytest.raises(ValueError, match="difficulty"):
        generate(rng, geo, "medium")


@given(seed=st.integers(0, 10_000), shape=st.sampled_from(SHAPES))
def test_symmetries_keep_validity_uniqueness_and_grade(seed, shape):
    geo, rng = geometry(*shape), random.Random(seed)
    puzzle, solution = generate(rng, geo, "singles") if shape != (3, 3) else _fixed_9x9()
    new_puzzle, new_solution = random_symmetry(puzzle, solution, rng, geo)
    assert is_valid_solution(new_puzzle, new_solution, geo)
    assert solve_all(new_puzzle, geo, limit=2) == [new_solution]
    assert sum(v > 0 for v in new_puzzle) == sum(v > 0 for v in puzzle)
    assert grade(new_puzzle, geo)[0] == grade(puzzle, geo)[0]


def _fixed_9x9():
    puzzle = parse_grid("......95....64..7......7.1..38.15..25..87..6...72.....7...5...9.5.....2.3.94.....")
    return puzzle, solve(puzzle)
