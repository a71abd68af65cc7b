"""Difficulty of a Sudoku by the human strategies it needs, and a generator of graded unique puzzles.

Grades, in order: ``singles`` (naked + hidden singles suffice), ``advanced`` (also needs locked
candidates, naked/hidden pairs and triples, X-wing or XY-wing), ``search`` (those strategies get stuck;
trial and error is needed). Training on ``singles`` and testing on the others makes "hard" mean
"strategies absent from the training mix".
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from dihal_fast.errors import DihalValueError
from dihal_fast.tasks.sudoku import (
    Geometry,
    count_solutions,
    initial_candidates,
    propagate_singles,
    random_solution,
)

GRADES = ("singles", "advanced", "search")
# The difficulties a training pool can ask for, and the grades each accepts.
DIFFICULTIES = {
    "singles": ("singles",),
    "advanced": ("advanced",),
    "search": ("search",),
    "hard": ("advanced", "search"),
}


def _bits(mask: int) -> list[int]:
    return [1 << d for d in range(mask.bit_length()) if mask >> d & 1]


def _eliminate(cands: list[int], cells, mask: int) -> bool:
    """Remove ``mask`` from ``cells``; True when anything changed."""
    changed = False
    for cell in cells:
        if cands[cell] & mask:
            cands[cell] &= ~mask
            changed = True
    return changed


def locked_candidates(cands: list[int], geo: Geometry) -> bool:
    """Pointing and claiming: a digit confined to a box-line intersection leaves the rest of both."""
    n = geo.n
    lines, boxes = geo.units[: 2 * n], geo.units[2 * n :]
    for box in boxes:
        box_set = set(box)
        for line in lines:
            inter = box_set.intersection(line)
            if not inter:
                continue
            for bit in _bits(geo.full):
                in_inter = any(cands[c] & bit for c in inter)
                if not in_inter:
                    continue
                in_box_rest = any(cands[c] & bit for c in box if c not in inter)
                in_line_rest = any(cands[c] & bit for c in line if c not in inter)
                if not in_box_rest and in_line_rest:
                    return _eliminate(cands, [c for c in line if c not in inter], bit)
                if not in_line_rest and in_box_rest:
                    return _eliminate(cands, [c for c in box if c not in inter], bit)
    return False


def naked_subsets(cands: list[int], geo: Geometry, size: int) -> bool:
    """``size`` cells of a unit whose candidates span ``size`` digits: remove those digits elsewhere."""
    for unit in geo.units:
        open_cells = [c for c in unit if cands[c].bit_count() > 1]
        for combo in itertools.combinations(open_cells, size):
            union = 0
            for c in combo:
                union |= cands[c]
            if union.bit_count() == size and _eliminate(cands, [c for c in unit if c not in combo], union):
                return True
    return False


def hidden_subsets(cands: list[int], geo: Geometry, size: int) -> bool:
    """``size`` digits confined to ``size`` cells of a unit: remove other digits from those cells."""
    for unit in geo.units:
        open_digits = 0
        for c in unit:
            if cands[c].bit_count() > 1:
                open_digits |= cands[c]
        for combo in itertools.combinations(_bits(open_digits), size):
            digits = sum(combo)
            cells = [c for c in unit if cands[c] & digits]
            if len(cells) == size and all(any(cands[c] & d for c in cells) for d in combo):
                if any(cands[c] & ~digits for c in cells):
                    for c in cells:
                        cands[c] &= digits
                    return True
    return False


def x_wing(cands: list[int], geo: Geometry) -> bool:
    """A digit with exactly two places in each of two rows (columns), in the same two columns (rows)."""
    n = geo.n
    for base, cover in ((geo.units[:n], geo.units[n : 2 * n]), (geo.units[n : 2 * n], geo.units[:n])):
        for bit in _bits(geo.full):
            spots = {}
            for i, line in enumerate(base):
                where = tuple(j for j, c in enumerate(line) if cands[c] & bit and cands[c] != bit)
                if len(where) == 2:
                    spots.setdefault(where, []).append(i)
            for where, line_ids in spots.items():
                if len(line_ids) != 2:
                    continue
                keep = {base[i][j] for i in line_ids for j in where}
                targets = [c for j in where for c in cover[j] if c not in keep]
                if _eliminate(cands, targets, bit):
                    return True
    return False


def xy_wing(cands: list[int], geo: Geometry) -> bool:
    """Pivot {a,b} seeing pincers {a,c} and {b,c}: cells seeing both pincers cannot hold c."""
    pairs = [c for c, m in enumerate(cands) if m.bit_count() == 2]
    for pivot in pairs:
        peer_pairs = [p for p in geo.peers[pivot] if cands[p].bit_count() == 2 and cands[p] != cands[pivot]]
        for p1, p2 in itertools.combinations(peer_pairs, 2):
            m0, m1, m2 = cands[pivot], cands[p1], cands[p2]
            shared1, shared2 = m0 & m1, m0 & m2
            if shared1.bit_count() != 1 or shared2.bit_count() != 1 or shared1 == shared2:
                continue
            c = m1 & ~m0
            if c.bit_count() != 1 or (m2 & ~m0) != c:
                continue
            targets = set(geo.peers[p1]).intersection(geo.peers[p2]) - {pivot}
            if _eliminate(cands, targets, c):
                return True
    return False


ADVANCED_STRATEGIES: tuple[tuple[str, Callable[[list[int], Geometry], bool]], ...] = (
    ("locked_candidates", locked_candidates),
    ("naked_pair", lambda c, g: naked_subsets(c, g, 2)),
    ("hidden_pair", lambda c, g: hidden_subsets(c, g, 2)),
    ("naked_triple", lambda c, g: naked_subsets(c, g, 3)),
    ("hidden_triple", lambda c, g: hidden_subsets(c, g, 3)),
    ("x_wing", x_wing),
    ("xy_wing", xy_wing),
)


def grade(puzzle: tuple[int, ...], geo: Geometry) -> tuple[str, list[str]]:
    """``(grade, strategies used)`` for a puzzle with a unique solution; ValueError when it has none."""
    cands = initial_candidates(puzzle, geo)
    if cands is None or not propagate_singles(cands, geo):
        raise DihalValueError("the puzzle has contradictory givens (no solution)")
    used: list[str] = []
    while any(m.bit_count() > 1 for m in cands):
        for name, strategy in ADVANCED_STRATEGIES:
            if strategy(cands, geo):
                if name not in used:
                    used.append(name)
                break
        else:
            return "search", used
        if not propagate_singles(cands, geo):
            raise DihalValueError("the puzzle has no solution (a strategy reached a contradiction)")
    return ("advanced" if used else "singles"), used


def _remove_clues(solution: tuple[int, ...], rng: random.Random, geo: Geometry, keep_singles: bool) -> tuple[int, ...]:
    """Blank cells in random order while the puzzle stays unique (and singles-solvable if asked)."""
    puzzle = list(solution)
    order = list(range(geo.cells))
    rng.shuffle(order)
    for cell in order:
        value, puzzle[cell] = puzzle[cell], 0
        trial = tuple(puzzle)
        if keep_singles:
            cands = initial_candidates(trial, geo)
            ok = propagate_singles(cands, geo) and all(m.bit_count() == 1 for m in cands)
        else:
            ok = count_solutions(trial, 2, geo) == 1
        if not ok:
            puzzle[cell] = value
    return tuple(puzzle)


def generate(
    rng: random.Random, geo: Geometry, difficulty: str = "singles", max_tries: int = 200
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A ``(puzzle, solution)`` pair with a unique solution and the requested grade.

    ``singles``: clues removed while singles still solve it (unique by construction).
    ``advanced`` / ``search`` / ``hard`` (either): minimal unique puzzles, drawn until the grade matches.
    """
    if difficulty not in DIFFICULTIES:
        raise DihalValueError(f"difficulty must be one of {sorted(DIFFICULTIES)}, got {difficulty!r}")
    for _ in range(max_tries):
        solution = random_solution(rng, geo)
        puzzle = _remove_clues(solution, rng, geo, keep_singles=difficulty == "singles")
        if grade(puzzle, geo)[0] in DIFFICULTIES[difficulty]:
            return puzzle, solution
    raise DihalValueError(
        f"no {difficulty!r} {geo.n}x{geo.n} puzzle in {max_tries} tries; this grid size may not have any "
        "(choose an easier difficulty or a larger box)"
    )
