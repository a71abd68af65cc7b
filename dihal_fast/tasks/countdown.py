"""Countdown: reach a target from given numbers with +, *, larger-smaller and exact division.

Problems are written ``58,11,80,83,81`` (the numbers, then the target) and solutions as a
comma-separated list of steps ``80-58=22,22/11=2,83-2=81`` (the Stream-of-Search format). Two checkers:
``check_strict`` (every step true, each given number used exactly once, final result = target) and
``check_loose`` (every step true, final result = target; what most public code checks).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass

from dihal_fast.errors import DihalValueError

OPS = "+-*/"
TARGET_RANGE = (10, 100)
OPERAND_RANGE = (1, 99)
# Held-out targets (never used for generated training problems): every target ending in 7.
HELD_OUT_TARGETS = frozenset(t for t in range(TARGET_RANGE[0], TARGET_RANGE[1] + 1) if t % 10 == 7)
_STEP = re.compile(r"^(\d+)([+\-*/])(\d+)=(\d+)$")
COUNTS = (2, 6)  # numbers per problem: exhaustive search beyond 6 takes hours
# Draws of :func:`generate` before it says that no problem fits (a fitting draw takes a few dozen).
MAX_DRAWS = 100_000


def shortest_solution(count: int) -> int:
    """Characters of the shortest possible solution with ``count`` numbers: ``count - 1`` steps of at least
    ``a+b=c`` (5 characters; the last at least 6, as targets are >= 10) and the commas between them."""
    return 6 * (count - 1)


@dataclass(frozen=True)
class Problem:
    """Numbers to combine and the target to reach."""

    nums: tuple[int, ...]
    target: int

    def text(self) -> str:
        return ",".join(str(v) for v in (*self.nums, self.target))


def parse_problem(text: str) -> Problem:
    """Parse ``n1,n2,...,target`` (3-6 positive integers in all); ValueError names a bad field."""
    fields = [f.strip() for f in text.split(",")]
    if len(fields) < 3:
        raise DihalValueError(f"a Countdown problem is 'n1,n2,...,target' with at least 2 numbers, got {text!r}")
    for f in fields:
        if not f.isdigit():
            raise DihalValueError(f"Countdown fields must be non-negative integers, got {f!r} in {text!r}")
    values = [int(f) for f in fields]
    return Problem(tuple(values[:-1]), values[-1])


def apply_op(a: int, op: str, b: int) -> int | None:
    """``a op b`` under the Countdown rules, or None when not allowed (negative or inexact)."""
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "-":
        return a - b if a >= b else None
    if op == "/":
        return a // b if b and a % b == 0 else None
    raise DihalValueError(f"operator must be one of {OPS!r}, got {op!r}")


def parse_steps(solution: str) -> list[tuple[int, str, int, int]] | None:
    """``[(a, op, b, result), ...]`` or None when any step is not of the form ``a op b=c``."""
    steps = []
    for part in solution.strip().split(","):
        match = _STEP.match(part.strip())
        if not match:
            return None
        a, op, b, c = match.groups()
        steps.append((int(a), op, int(b), int(c)))
    return steps


def true_step_share(solution: str) -> float:
    """Share of the written steps that are arithmetically true (0 when the text is not a step list)."""
    steps = parse_steps(solution)
    if not steps:
        return 0.0
    return sum(apply_op(a, op, b) == c for a, op, b, c in steps) / len(steps)


def check_loose(problem: Problem, solution: str) -> bool:
    """Every step is arithmetically true and the last result equals the target."""
    steps = parse_steps(solution)
    if not steps:
        return False
    return all(apply_op(a, op, b) == c for a, op, b, c in steps) and steps[-1][3] == problem.target


def check_strict(problem: Problem, solution: str) -> bool:
    """Loose, plus: each step uses available numbers, every given number is used exactly once."""
    if not check_loose(problem, solution):
        return False
    pool = Counter(problem.nums)
    for a, _op, b, c in parse_steps(solution):
        for operand in (a, b):
            if pool[operand] <= 0:
                return False
            pool[operand] -= 1
        pool[c] += 1
    return +pool == Counter([problem.target])


def _combine(a: int, b: int) -> list[tuple[str, int]]:
    """The steps allowed on two numbers, written larger-first as ``(step text, result)``."""
    hi, lo = max(a, b), min(a, b)
    out = [(f"{hi}+{lo}", hi + lo), (f"{hi}*{lo}", hi * lo), (f"{hi}-{lo}", hi - lo)]
    if lo and hi % lo == 0:
        out.append((f"{hi}/{lo}", hi // lo))
    return out


def solve(problem: Problem) -> str | None:
    """A strict solution found by exhaustive depth-first search, or None when none exists."""

    def search(pool: list[int], steps: list[str]) -> str | None:
        if len(pool) == 1:
            return ",".join(steps) if pool[0] == problem.target else None
        for i in range(len(pool)):
            for j in range(i + 1, len(pool)):
                rest = pool[:i] + pool[i + 1 : j] + pool[j + 1 :]
                for text, value in _combine(pool[i], pool[j]):
                    found = search(rest + [value], steps + [f"{text}={value}"])
                    if found:
                        return found
        return None

    if not COUNTS[0] <= len(problem.nums) <= COUNTS[1]:
        raise DihalValueError(
            f"a Countdown problem has {COUNTS[0]}-{COUNTS[1]} numbers, got {len(problem.nums)} in "
            f"{problem.text()[:80]!r}"
        )
    return search(list(problem.nums), [])


def generate(rng: random.Random, count: int, held_out: bool = False, max_len: int | None = None) -> tuple[Problem, str]:
    """A random problem with ``count`` numbers and one strict solution (Stream-of-Search protocol).

    Numbers are uniform in 1-99; random pairs are combined with a random allowed operation until one
    number is left, and the draw is kept when it lands in 10-100 on a training target (or, with
    ``held_out``, on a held-out target) and the solution fits in ``max_len`` characters. A ``max_len``
    below :func:`shortest_solution` is refused at once, and :data:`MAX_DRAWS` draws without a fitting
    problem end in a ``ValueError`` rather than a hang.
    """
    if not COUNTS[0] <= count <= COUNTS[1]:
        raise DihalValueError(f"count must be {COUNTS[0]}-{COUNTS[1]} numbers, got {count}")
    if max_len is not None and max_len < shortest_solution(count):
        raise DihalValueError(
            f"no solution with {count} numbers fits in {max_len} characters (the shortest has "
            f"{shortest_solution(count)}); raise --countdown-len or use 0 for the default"
        )
    for _ in range(MAX_DRAWS):
        nums = [rng.randint(*OPERAND_RANGE) for _ in range(count)]
        pool, steps = list(nums), []
        while len(pool) > 1:
            i, j = rng.sample(range(len(pool)), 2)
            text, value = rng.choice(_combine(pool[i], pool[j]))
            pool = [v for k, v in enumerate(pool) if k not in (i, j)] + [value]
            steps.append(f"{text}={value}")
        target, solution = pool[0], ",".join(steps)
        if not TARGET_RANGE[0] <= target <= TARGET_RANGE[1] or (target in HELD_OUT_TARGETS) != held_out:
            continue
        if max_len is not None and len(solution) > max_len:
            continue
        return Problem(tuple(nums), target), solution
    raise DihalValueError(
        f"no {count}-number problem with a solution of at most {max_len} characters in {MAX_DRAWS} "
        "draws; raise --countdown-len or use 0 for the default"
    )
