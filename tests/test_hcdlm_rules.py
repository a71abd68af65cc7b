"""The task-rule verifier of best-of-K (:mod:`dihal_fast.hcdlm.rules`): hand-made Sudoku boards and Countdown answers
against hand counts and an obviously-correct reference, zero exactly for the answers the task's own checker accepts,
and the removed ``final`` verifier refused in one line."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dihal_fast.errors import DihalValueError
from dihal_fast.hcdlm import protocol
from dihal_fast.hcdlm.config import SampleConfig
from dihal_fast.hcdlm.rules import countdown_rule_score, rule_scores, sudoku_rule_breaks
from dihal_fast.tasks.countdown import Problem, check_strict, generate
from dihal_fast.tasks.countdown_task import CountdownTask
from dihal_fast.tasks.sudoku import geometry, is_valid_solution
from dihal_fast.tasks.sudoku_task import SudokuTask

SOLUTION4 = (1, 2, 3, 4, 3, 4, 1, 2, 2, 1, 4, 3, 4, 3, 2, 1)
PUZZLE4 = (1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0)


def _reference_breaks(box_rows: int, box_cols: int, puzzle: tuple[int, ...], grid: tuple[int, ...]) -> int:
    """Pure Python: for every row, column and box (sliced from the flat grid), the digits 1..n it lacks; plus the
    given cells whose digit the grid changes."""
    n = box_rows * box_cols
    rows = [grid[r * n : (r + 1) * n] for r in range(n)]
    cols = [grid[c::n] for c in range(n)]
    boxes = [
        [grid[(top + r) * n + left + c] for r in range(box_rows) for c in range(box_cols)]
        for top in range(0, n, box_rows)
        for left in range(0, n, box_cols)
    ]
    missing = sum(sum(1 for digit in range(1, n + 1) if digit not in unit) for unit in rows + cols + boxes)
    return missing + sum(1 for p, g in zip(puzzle, grid) if p and p != g)


def _breaks(box: tuple[int, int], puzzle, grid) -> int:
    return int(sudoku_rule_breaks(geometry(*box), torch.tensor([puzzle]), torch.tensor([grid]))[0])


@pytest.mark.parametrize(
    ("grid", "expected"),
    [
        (SOLUTION4, 0),  # the solution
        (
            (2, 1, *SOLUTION4[2:]),
            3,
        ),  # two cells of row 0 swapped: columns 0 and 1 lack a digit; the given 1 overwritten
        ((1,) * 16, 37),  # all ones: each of the 12 units lacks 3 digits; the given 4 overwritten
        ((*SOLUTION4[:12], 3, 4, 2, 1), 3),  # two cells of the last row swapped: two columns, the box keeps its digits
    ],
)
def test_hand_made_4x4_boards(grid, expected):
    assert _breaks((2, 2), PUZZLE4, grid) == expected == _reference_breaks(2, 2, PUZZLE4, grid)


def test_a_valid_9x9_board_breaks_nothing_and_one_changed_cell_breaks_three_units_and_a_given():
    solution = [((r * 3 + r // 3 + c) % 9) + 1 for r in range(9) for c in range(9)]  # a valid 9x9 pattern board
    assert is_valid_solution(tuple([0] * 81), tuple(solution), geometry(3, 3))
    puzzle = [solution[0]] + [0] * 80
    assert _breaks((3, 3), puzzle, solution) == 0
    changed = [solution[1]] + solution[1:]  # cell 0 now repeats its row neighbour's digit
    assert _breaks((3, 3), puzzle, changed) == 3 + 1 == _reference_breaks(3, 3, tuple(puzzle), tuple(changed))


@given(
    box=st.sampled_from([(2, 2), (2, 3), (3, 2), (3, 3)]),
    seed=st.integers(0, 2**16),
    solved=st.booleans(),
    givens=st.floats(0.0, 1.0),
)
def test_sudoku_breaks_match_the_reference_and_are_zero_exactly_for_valid_boards(box, seed, solved, givens):
    """Random boards (and, half the time, a valid one with a few cells changed) against the pure-Python reference and
    the task's own check of a valid board keeping the givens."""
    rng, geo = random.Random(seed), geometry(*box)
    n = geo.n
    if solved:
        band = [((r % box[0]) * box[1] + r // box[0] + c) % n + 1 for r in range(n) for c in range(n)]
        grid = list(band)
        for _ in range(rng.randrange(3)):
            grid[rng.randrange(n * n)] = rng.randint(1, n)
    else:
        grid = [rng.randint(1, n) for _ in range(n * n)]
    puzzle = [g if rng.random() < givens else 0 for g in grid]
    for _ in range(rng.randrange(2)):
        puzzle[rng.randrange(n * n)] = rng.randint(1, n)
    got = _breaks(box, puzzle, grid)
    assert got == _reference_breaks(*box, tuple(puzzle), tuple(grid))
    assert (got == 0) == is_valid_solution(tuple(puzzle), tuple(grid), geo)


def test_sudoku_rule_scores_read_the_givens_from_the_context_and_digits_from_the_tokens():
    task = SudokuTask(2, 2)
    boards = [SOLUTION4, (2, 1, *SOLUTION4[2:]), (1,) * 16]
    context = torch.tensor([task.example(PUZZLE4, SOLUTION4, "g").context] * 3)
    tokens = torch.tensor([[digit - 1 for digit in board] for board in boards])
    scores = rule_scores(task, context, tokens)
    assert scores.dtype == torch.float64 and scores.tolist() == [0.0, -3.0, -37.0]


PROBLEM = Problem((58, 11, 80, 83), 81)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80-58=22,22/11=2,83-2=81", 0.0),  # strictly correct
        ("80-58=22,22/11=2,83-2=80", -(1 + 1 / 2)),  # the last step false, and 80 is 1 from the target
        ("80+58=138", -(2 + 57 / 58)),  # 11 and 83 unused, 57 from the target
        ("99-18=81", -6.0),  # neither operand given, the four given numbers unused
        ("83-11=72,72+11=83", -(3 + 2 / 3)),  # the one 11 used twice, 58 and 80 unused, 2 from the target
        ("80-58=22,22-11=11,83-11=72", -9 / 10),  # every rule kept (the second 11 is a result), 9 from the target
        ("80-58", -math.inf),  # not a step list
        ("", -math.inf),
    ],
)
def test_hand_made_countdown_answers(text, expected):
    assert countdown_rule_score(PROBLEM, text) == pytest.approx(expected, abs=1e-12)


@given(seed=st.integers(0, 2**16), count=st.integers(3, 5), edits=st.integers(0, 2))
def test_countdown_score_is_zero_exactly_for_strict_solutions(seed, count, edits):
    """A generated problem's own solution scores 0; with a few characters changed, it scores 0 exactly when the
    task's strict checker still accepts it, and below 0 otherwise."""
    rng = random.Random(seed)
    problem, solution = generate(rng, count)
    text = list(solution)
    for _ in range(edits):
        text[rng.randrange(len(text))] = rng.choice("0123456789+-*/=,")
    answer = "".join(text)
    score = countdown_rule_score(problem, answer)
    assert (score == 0) == check_strict(problem, answer) and score <= 0
    assert countdown_rule_score(problem, solution) == 0


def test_countdown_rule_scores_decode_the_problem_from_the_context():
    task = CountdownTask((4,))
    context = torch.tensor([task.example(PROBLEM, "g").context] * 2)
    tokens = torch.tensor([task.encode_solution("80-58=22,22/11=2,83-2=81"), task.encode_solution("80+58=138")])
    assert rule_scores(task, context, tokens).tolist() == pytest.approx([0.0, -(2 + 57 / 58)])


def test_a_task_without_rules_is_refused_in_one_line():
    text_task = SimpleNamespace(spec=SimpleNamespace(name="text"))
    with pytest.raises(DihalValueError, match="a text run has none: use --verifier chain") as info:
        rule_scores(text_task, torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))
    assert len(str(info.value).splitlines()) == 1


def test_the_removed_final_verifier_is_refused_in_one_line_with_its_replacement():
    with pytest.raises(DihalValueError, match="--verifier final was removed: .*use --verifier rules") as info:
        SampleConfig(verifier="final")
    assert len(str(info.value).splitlines()) == 1
    kept = {"steps": 4, "temperature": 0.0, "reveal_noise": 0.1, "givens": True, "verifier": "final", "best_of": 3}
    with pytest.raises(DihalValueError, match="--verifier final was removed"):  # a choice kept before the removal
        protocol.chosen_configs({"single": {**kept, "best_of": 1, "verifier": "chain"}, "best_of": kept})
    with pytest.raises(DihalValueError, match="--verifier must be one of chain, rules; got 'best'"):
        SampleConfig(verifier="best")
