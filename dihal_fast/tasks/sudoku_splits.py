"""Sudoku splits that do not share a puzzle up to the training augmentation, and the hash that names a split.

Training applies :func:`~dihal_fast.tasks.sudoku.random_symmetry` (digit relabelling, line permutations inside
bands and stacks, band and stack permutations, a transpose when boxes are square), so a test board that is a
symmetric image of a pool board is not new to the model. :func:`symmetry_key` is invariant under that whole group:
equal keys mean "maybe the same puzzle up to symmetry", different keys "certainly not". The key is conservative
(two unrelated puzzles may share one, and are then treated as overlapping), which is the safe side for a split.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from dihal_fast.errors import DihalValueError
from dihal_fast.tasks.sudoku import Geometry, format_grid
from dihal_fast.tasks.sudoku_grade import generate

Pair = tuple[tuple[int, ...], tuple[int, ...]]
PATIENCE = 2000  # draws in a row without a new puzzle before fresh_puzzles gives up
LEVELS = {"easy": "singles", "hard": "hard"}  # a split file's level -> the generator's difficulty
SPLIT_NAMES = ("validation", "test")


def _line_profile(bands: list[list[tuple[int, ...]]]) -> tuple:
    """The signatures of the lines of each band (or stack), invariant under permuting lines and bands."""
    return tuple(sorted(tuple(sorted(band)) for band in bands))


def _box_profile(matrix: list[list[tuple[int, ...]]]) -> tuple:
    """The signature matrix of boxes (bands x stacks), smallest over band and stack permutations."""
    rows, cols = len(matrix), len(matrix[0])
    return min(
        tuple(matrix[r][c] for r in band_order for c in stack_order)
        for band_order in itertools.permutations(range(rows))
        for stack_order in itertools.permutations(range(cols))
    )


def _oriented_key(puzzle: Sequence[int], geo: Geometry, transpose: bool) -> tuple:
    """Line and box signatures: a unit's signature is the sorted multiset, over its givens, of how often the given's
    digit is given in the whole puzzle (relabelling keeps those counts; permutations move units, not contents)."""
    n, br, bc = geo.n, geo.box_rows, geo.box_cols
    at = (lambda r, c: c * n + r) if transpose else (lambda r, c: r * n + c)
    times = {d: sum(p == d for p in puzzle) for d in range(1, n + 1)}

    def signature(cells) -> tuple[int, ...]:
        return tuple(sorted(times[puzzle[at(r, c)]] for r, c in cells if puzzle[at(r, c)]))

    rows = [[signature((r, c) for c in range(n)) for r in range(b * br, (b + 1) * br)] for b in range(n // br)]
    cols = [[signature((r, c) for r in range(n)) for c in range(s * bc, (s + 1) * bc)] for s in range(n // bc)]
    boxes = [
        [
            signature((r, c) for r in range(b * br, (b + 1) * br) for c in range(s * bc, (s + 1) * bc))
            for s in range(n // bc)
        ]
        for b in range(n // br)
    ]
    return _line_profile(rows), _line_profile(cols), _box_profile(boxes)


def symmetry_key(puzzle: Sequence[int], geo: Geometry) -> tuple:
    """A key equal for a puzzle and every image of it under the training symmetries (see the module docstring):
    the given counts per digit (up to relabelling) and the signatures of the lines (per band and stack) and boxes
    (up to band and stack order) of :func:`_oriented_key`; a puzzle's givens fix its solution, so the key covers the
    pair."""
    if len(puzzle) != geo.cells:
        raise DihalValueError(f"a {geo.n}x{geo.n} puzzle has {geo.cells} cells, got {len(puzzle)}")
    key = _oriented_key(puzzle, geo, transpose=False)
    if geo.box_rows == geo.box_cols:  # a transpose maps rows to columns: the smaller orientation names both
        key = min(key, _oriented_key(puzzle, geo, transpose=True))
    digits = tuple(sorted(sum(p == d for p in puzzle) for d in range(1, geo.n + 1)))
    return (sum(p != 0 for p in puzzle), digits, *key)


def check_disjoint(splits: Mapping[str, Iterable[Pair]], geo: Geometry) -> dict[str, int]:
    """Refuse splits that share a puzzle up to symmetry (equal :func:`symmetry_key`), naming the two splits and how
    many of their puzzles collide; returns the size of each split."""
    keys = {name: [symmetry_key(p, geo) for p, _ in pairs] for name, pairs in splits.items()}
    for (a, keys_a), (b, keys_b) in itertools.combinations(keys.items(), 2):
        shared = set(keys_a) & set(keys_b)
        if shared:
            count = sum(k in shared for k in keys_b)
            raise DihalValueError(
                f"{count} puzzle(s) of {b!r} may be a symmetric image of one in {a!r} (training symmetries: relabel, "
                "line and band permutations, transpose); draw the splits apart"
            )
    return {name: len(k) for name, k in keys.items()}


def fresh_puzzles(draw: Callable[[], Pair], count: int, geo: Geometry, exclude: Iterable[Pair] = ()) -> list[Pair]:
    """``count`` puzzles from ``draw()`` (one ``(puzzle, solution)`` per call) whose keys are new: neither in
    ``exclude`` nor shared with an earlier draw, so the result passes :func:`check_disjoint` against ``exclude``.
    :data:`PATIENCE` draws in a row without a new key are an error, never a hang."""
    seen = {symmetry_key(p, geo) for p, _ in exclude}
    out: list[Pair] = []
    misses = 0
    while len(out) < count:
        puzzle, solution = draw()
        key = symmetry_key(puzzle, geo)
        misses = misses + 1 if key in seen else 0
        if misses >= PATIENCE:
            raise DihalValueError(
                f"only {len(out)} of {count} fresh {geo.n}x{geo.n} puzzles after {PATIENCE} draws in a row"
            )
        if key not in seen:
            seen.add(key)
            out.append((puzzle, solution))
    return out


def split_hash(pairs: Iterable[Pair]) -> str:
    """sha256 (hex) of a split's puzzles in order, one ``puzzle,solution`` line each: what a record cites."""
    digest = hashlib.sha256()
    for puzzle, solution in pairs:
        digest.update(f"{''.join(map(str, puzzle))},{''.join(map(str, solution))}\n".encode())
    return digest.hexdigest()


def draw_splits(
    geo: Geometry, seed: int, per_level: int, exclude: Iterable[Pair] = (), names: Sequence[str] = SPLIT_NAMES
) -> dict[str, list[tuple[Pair, str]]]:
    """``per_level`` fresh puzzles of each :data:`LEVELS` level for each split in ``names``, as ``(pair, level)``
    rows: drawn by :func:`fresh_puzzles` from a stream named by ``seed``, split and level, apart from ``exclude``
    (the training pools) and from every earlier split and level, so the splits pass :func:`check_disjoint`."""
    taken = list(exclude)
    splits: dict[str, list[tuple[Pair, str]]] = {}
    for name in names:
        splits[name] = []
        for level, difficulty in LEVELS.items():
            draw = functools.partial(generate, random.Random(f"sudoku-split-{seed}-{name}-{level}"), geo, difficulty)
            pairs = fresh_puzzles(draw, per_level, geo, exclude=taken)
            taken += pairs
            splits[name] += [(pair, level) for pair in pairs]
    return splits


def write_split_csv(path: str | Path, rows: Iterable[tuple[Pair, str]]) -> None:
    """A ``puzzle,solution,level`` CSV (``.`` for a blank) that :func:`~dihal_fast.tasks.data.load_sudoku_csv`
    reads back."""
    with Path(path).open("w", encoding="utf-8", newline="") as handle:
        handle.write("puzzle,solution,level\n")
        handle.writelines(f"{format_grid(p)},{format_grid(s)},{level}\n" for (p, s), level in rows)
