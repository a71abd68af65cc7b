"""Sudoku of any box shape (2x2 -> 4x4, 2x3 -> 6x6, 3x3 -> 9x9): parsing, an exact solver, symmetries.

Grids are flat tuples of ``n*n`` ints in row-major order, 0 = empty, 1..n = digits. The solver keeps one
candidate bitmask per cell (bit ``d-1`` set = digit ``d`` possible), propagates naked and hidden singles
to a fixpoint and branches on the cell with the fewest candidates; it counts solutions up to a limit, so
``count_solutions(p, 2) == 1`` is the uniqueness test used by the generator.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from dihal_fast.errors import DihalValueError

DIGITS = "123456789"


@dataclass(frozen=True)
class Geometry:
    """Units and peers of a Sudoku with ``box_rows x box_cols`` boxes (side ``n = box_rows * box_cols``)."""

    box_rows: int
    box_cols: int
    units: tuple[tuple[int, ...], ...]  # rows, then columns, then boxes
    peers: tuple[tuple[int, ...], ...]

    @property
    def n(self) -> int:
        return self.box_rows * self.box_cols

    @property
    def cells(self) -> int:
        return self.n * self.n

    @property
    def full(self) -> int:
        """Bitmask with all ``n`` digits set."""
        return (1 << self.n) - 1

    def box_of(self, cell: int) -> int:
        row, col = divmod(cell, self.n)
        return (row // self.box_rows) * self.box_rows + col // self.box_cols


@functools.cache
def geometry(box_rows: int = 3, box_cols: int = 3) -> Geometry:
    """The (cached) geometry of a Sudoku with ``box_rows x box_cols`` boxes."""
    if not (1 <= box_rows <= 3 and 1 <= box_cols <= 3) or box_rows * box_cols < 2:
        raise DihalValueError(f"box shape must be between 1x2 and 3x3, got {box_rows}x{box_cols}")
    n = box_rows * box_cols
    rows = [tuple(r * n + c for c in range(n)) for r in range(n)]
    cols = [tuple(r * n + c for r in range(n)) for c in range(n)]
    boxes = []
    for br in range(0, n, box_rows):
        for bc in range(0, n, box_cols):
            boxes.append(tuple((br + r) * n + bc + c for r in range(box_rows) for c in range(box_cols)))
    units = tuple(rows + cols + boxes)
    peers = tuple(tuple(sorted({p for unit in units if cell in unit for p in unit} - {cell})) for cell in range(n * n))
    return Geometry(box_rows, box_cols, units, peers)


def geometry_for_size(cells: int) -> Geometry:
    """The geometry of a square grid with ``cells`` cells (16, 36 or 81)."""
    shapes = {16: (2, 2), 36: (2, 3), 81: (3, 3)}
    if cells not in shapes:
        raise DihalValueError(f"a Sudoku grid has 16, 36 or 81 cells, got {cells}")
    return geometry(*shapes[cells])


def parse_grid(text: str, geo: Geometry | None = None) -> tuple[int, ...]:
    """Parse a row-major grid string (``.`` or ``0`` = empty, whitespace ignored) into a tuple of ints.

    Raises ValueError naming the problem for a wrong length or a character that is not a digit of the
    grid. Contradictory givens are not checked here (see :func:`givens_consistent`).
    """
    chars = "".join(text.split())
    geo = geo or geometry_for_size(len(chars))
    if len(chars) != geo.cells:
        raise DihalValueError(f"a {geo.n}x{geo.n} Sudoku needs {geo.cells} cells, got {len(chars)} in {text[:100]!r}")
    allowed = ".0" + DIGITS[: geo.n]
    bad = sorted({ch for ch in chars if ch not in allowed})
    if bad:
        raise DihalValueError(f"Sudoku cells must be one of {allowed!r}; found {''.join(bad)!r} in {text[:100]!r}")
    return tuple(0 if ch in ".0" else int(ch) for ch in chars)


def format_grid(grid: tuple[int, ...] | list[int], pretty: bool = False, geo: Geometry | None = None) -> str:
    """Row-major string (``.`` for empty); ``pretty`` adds line breaks and box separators."""
    flat = "".join("." if v == 0 else str(v) for v in grid)
    if not pretty:
        return flat
    geo = geo or geometry_for_size(len(flat))
    lines = []
    for r in range(geo.n):
        if r and r % geo.box_rows == 0:
            lines.append("-" * (2 * geo.n + 2 * (geo.n // geo.box_cols - 1) - 1))
        row = flat[r * geo.n : (r + 1) * geo.n]
        parts = [" ".join(row[c : c + geo.box_cols]) for c in range(0, geo.n, geo.box_cols)]
        lines.append(" | ".join(parts))
    return "\n".join(lines)


def givens_consistent(grid: tuple[int, ...], geo: Geometry) -> bool:
    """True when no unit holds the same given digit twice."""
    for unit in geo.units:
        vals = [grid[i] for i in unit if grid[i]]
        if len(vals) != len(set(vals)):
            return False
    return True


def is_valid_solution(puzzle: tuple[int, ...], solution: tuple[int, ...], geo: Geometry) -> bool:
    """True when ``solution`` is a complete valid grid that agrees with every given of ``puzzle``."""
    if len(solution) != geo.cells or any(not 1 <= v <= geo.n for v in solution):
        return False
    if any(p and p != s for p, s in zip(puzzle, solution)):
        return False
    return all(len({solution[i] for i in unit}) == geo.n for unit in geo.units)


def blank_cell_accuracy(puzzle: tuple[int, ...], solution: tuple[int, ...], grid: tuple[int, ...]) -> float:
    """Share of the puzzle's empty cells that ``grid`` fills with the solution's digit (partial credit)."""
    blanks = [i for i, v in enumerate(puzzle) if v == 0]
    if not blanks:
        return 1.0
    return sum(grid[i] == solution[i] for i in blanks) / len(blanks)


def initial_candidates(grid: tuple[int, ...], geo: Geometry) -> list[int] | None:
    """Candidate bitmasks of every cell (givens as single bits), or None for contradictory givens."""
    if not givens_consistent(grid, geo):
        return None
    return [geo.full if v == 0 else 1 << (v - 1) for v in grid]


def propagate_singles(cands: list[int], geo: Geometry) -> bool:
    """Apply naked and hidden singles in place until nothing changes; False on a contradiction."""
    placed = [False] * geo.cells
    changed = True
    while changed:
        changed = False
        for cell, mask in enumerate(cands):
            if mask == 0:
                return False
            if not placed[cell] and mask & (mask - 1) == 0:
                placed[cell] = True
                for peer in geo.peers[cell]:
                    if cands[peer] & mask:
                        cands[peer] &= ~mask
                        if cands[peer] == 0:
                            return False
                        changed = True
        for unit in geo.units:
            once = twice = 0
            for cell in unit:
                twice |= once & cands[cell]
                once |= cands[cell]
            if once != geo.full:
                return False
            exactly_once = once & ~twice
            if not exactly_once:
                continue
            for cell in unit:
                hit = cands[cell] & exactly_once
                if hit and cands[cell] != hit:
                    if hit & (hit - 1):
                        return False  # two digits can only go in this one cell
                    cands[cell] = hit
                    changed = True
    return True


def _search(
    cands: list[int], geo: Geometry, limit: int, found: list[tuple[int, ...]], rng: random.Random | None
) -> None:
    if not propagate_singles(cands, geo):
        return
    best, best_count = -1, geo.n + 1
    for cell, mask in enumerate(cands):
        count = mask.bit_count()
        if 1 < count < best_count:
            best, best_count = cell, count
            if count == 2:
                break
    if best < 0:
        found.append(tuple(mask.bit_length() for mask in cands))
        return
    digits = [1 << d for d in range(geo.n) if cands[best] >> d & 1]
    if rng is not None:
        rng.shuffle(digits)
    for bit in digits:
        trial = cands.copy()
        trial[best] = bit
        _search(trial, geo, limit, found, rng)
        if len(found) >= limit:
            return


def solve_all(
    grid: tuple[int, ...], geo: Geometry | None = None, limit: int = 2, rng: random.Random | None = None
) -> list[tuple[int, ...]]:
    """Up to ``limit`` solutions of ``grid`` (empty list = no solution, e.g. contradictory givens)."""
    geo = geo or geometry_for_size(len(grid))
    if limit < 1:
        raise DihalValueError(f"limit must be >= 1, got {limit}")
    cands = initial_candidates(grid, geo)
    found: list[tuple[int, ...]] = []
    if cands is not None:
        _search(cands, geo, limit, found, rng)
    return found


def count_solutions(grid: tuple[int, ...], limit: int = 2, geo: Geometry | None = None) -> int:
    """Number of solutions, counted up to ``limit`` (so 2 means "two or more")."""
    return len(solve_all(grid, geo, limit))


def solve(grid: tuple[int, ...], geo: Geometry | None = None) -> tuple[int, ...] | None:
    """The unique solution of ``grid``; None when it has no solution.

    Raises ValueError when the puzzle has several solutions (it is then not a proper Sudoku).
    """
    found = solve_all(grid, geo, limit=2)
    if len(found) > 1:
        raise DihalValueError(f"the puzzle {format_grid(grid)} has more than one solution")
    return found[0] if found else None


def random_solution(rng: random.Random, geo: Geometry) -> tuple[int, ...]:
    """A uniformly-seeded random complete grid (search from the empty grid with shuffled digits)."""
    return solve_all(tuple([0] * geo.cells), geo, limit=1, rng=rng)[0]


def random_symmetry(
    puzzle: tuple[int, ...], solution: tuple[int, ...], rng: random.Random, geo: Geometry
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Apply one random validity-preserving symmetry to a puzzle and its solution.

    Digit relabelling, row permutations inside bands, band permutations, the same for columns and
    stacks, and a transpose when boxes are square: these keep uniqueness and the strategies needed.
    """
    n, br, bc = geo.n, geo.box_rows, geo.box_cols
    relabel = list(range(1, n + 1))
    rng.shuffle(relabel)

    def line_order(block: int) -> list[int]:
        blocks = list(range(n // block))
        rng.shuffle(blocks)
        order = []
        for b in blocks:
            inner = list(range(block))
            rng.shuffle(inner)
            order.extend(b * block + i for i in inner)
        return order

    rows, cols = line_order(br), line_order(bc)
    transpose = br == bc and rng.random() < 0.5

    def apply(grid: tuple[int, ...]) -> tuple[int, ...]:
        out = []
        for r in range(n):
            for c in range(n):
                src = rows[c] * n + cols[r] if transpose else rows[r] * n + cols[c]
                v = grid[src]
                out.append(relabel[v - 1] if v else 0)
        return tuple(out)

    return apply(puzzle), apply(solution)
