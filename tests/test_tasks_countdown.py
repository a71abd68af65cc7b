"""Countdown checkers, solver and generator, against the real problems and hand-made edge cases."""

from __future__ import annotations

import json
import random

import pytest

from dihal_fast.tasks.countdown import (
    HELD_OUT_TARGETS,
    Problem,
    apply_op,
    check_loose,
    check_strict,
    generate,
    parse_problem,
    solve,
)
from dihal_fast.tasks.data import detect_format, load_countdown_jsonl


@pytest.fixture(scope="module")
def real(shared_data):
    path = shared_data / "countdown.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return path, rows


def test_reference_solutions_pass_strict(real):
    _, rows = real
    assert len(rows) == 2256
    for row in rows:
        problem = Problem(tuple(row["nums"]), row["target"])
        assert check_strict(problem, row["solution"]) and check_loose(problem, row["solution"]), row["id"]


def test_loader_groups_and_format_detection(real):
    path, rows = real
    assert detect_format(path) == "countdown"
    problems = load_countdown_jsonl(path)
    assert [p.nums for p, _ in problems] == [tuple(r["nums"]) for r in rows]
    assert {g for _, g in problems} == {"cd3", "cd4"}


def test_solver_on_real_problems(real):
    _, rows = real
    for row in rows[2000:] + rows[:2000:20]:  # all CD3, every 20th CD4
        problem = Problem(tuple(row["nums"]), row["target"])
        found = solve(problem)
        assert found is not None and check_strict(problem, found), row["id"]


@pytest.mark.parametrize(
    "solution, strict, loose",
    [
        ("80-58=22,22/11=2,83-2=81", True, True),
        ("83-2=81", False, True),  # true and reaches the target, but 2 is not given and 80, 58, 11 are unused
        ("80+1=81", False, True),  # true and reaches the target, but 1 is not given and numbers are unused
        ("80-58=22,22/11=2,83-2=80", False, False),  # last step false
        ("80-58=22,22/11=2,83-2=82", False, False),  # last step false (and misses the target)
        ("58-80=22,22/11=2,83-2=81", False, False),  # negative subtraction is not allowed
        ("80-58=22,22/11=2,2+79=81", False, True),  # 79 is not available (83 unused)
        ("80-58=22,22/11=2,83-2=81,", False, False),  # trailing empty step
        ("", False, False),
        ("80-58=22;22/11=2", False, False),
    ],
)
def test_strict_and_loose(solution, strict, loose):
    problem = parse_problem("58,11,80,83,81")
    assert check_strict(problem, solution) is strict
    assert check_loose(problem, solution) is loose


def test_number_reuse_is_strictly_wrong():
    problem = Problem((5, 5, 7), 17)
    assert check_strict(problem, "5+5=10,10+7=17")
    assert not check_strict(Problem((5, 3, 7), 17), "5+5=10,10+7=17")
    assert check_loose(Problem((5, 3, 7), 17), "5+5=10,10+7=17")


def test_operations():
    assert apply_op(7, "/", 2) is None and apply_op(8, "/", 0) is None and apply_op(2, "-", 3) is None
    assert apply_op(8, "/", 2) == 4 and apply_op(3, "*", 4) == 12 and apply_op(5, "-", 5) == 0
    with pytest.raises(ValueError):
        apply_op(1, "^", 2)


def test_unsolvable_is_none():
    assert solve(Problem((1, 1, 1), 100)) is None


@pytest.mark.parametrize("text", ["1,2", "1,x,3", "1,,3", "1, -2, 3", "1.5,2,3"])
def test_bad_problem_text(text):
    with pytest.raises(ValueError):
        parse_problem(text)


@pytest.mark.parametrize("count", [3, 4, 5])
def test_generator_protocol(count):
    rng = random.Random(count)
    for held_out in (False, True):
        for _ in range(50):
            problem, solution = generate(rng, count, held_out=held_out, max_len=12 * (count - 1))
            assert len(problem.nums) == count and all(1 <= v <= 99 for v in problem.nums)
            assert 10 <= problem.target <= 100 and (problem.target in HELD_OUT_TARGETS) == held_out
            assert check_strict(problem, solution) and len(solution) <= 12 * (count - 1)
