"""Sudoku splits disjoint up to the training symmetries: the key is invariant under every symmetry training applies,
tells generated puzzles apart, catches a symmetric copy planted in a split, and fresh draws avoid a pool."""

from __future__ import annotations

import random

import pytest

from dihal_fast.tasks.sudoku import geometry, random_symmetry
from dihal_fast.tasks.sudoku_grade import generate
from dihal_fast.tasks.sudoku_splits import check_disjoint, fresh_puzzles, split_hash, symmetry_key

BOXES = [(2, 2), (2, 3), (3, 3)]


def _puzzles(geo, count: int, seed: str):
    rng = random.Random(seed)
    return [generate(rng, geo, "singles") for _ in range(count)]


@pytest.mark.parametrize("box", BOXES)
def test_the_key_is_invariant_under_every_training_symmetry(box):
    geo = geometry(*box)
    rng = random.Random(1)
    for puzzle, solution in _puzzles(geo, 5, f"inv-{box}"):
        key = symmetry_key(puzzle, geo)
        for _ in range(40):
            image, _ = random_symmetry(puzzle, solution, rng, geo)
            assert symmetry_key(image, geo) == key


@pytest.mark.parametrize(("box", "distinct"), [((2, 3), 0.95), ((3, 3), 0.99)])
def test_the_key_tells_generated_puzzles_apart(box, distinct):
    geo = geometry(*box)
    puzzles = _puzzles(geo, 100, f"apart-{box}")
    assert len({symmetry_key(p, geo) for p, _ in puzzles}) >= distinct * len(puzzles)


def test_a_symmetric_copy_in_another_split_is_refused_and_fresh_draws_avoid_the_pool():
    geo = geometry(2, 3)
    rng = random.Random("pool")
    pool = fresh_puzzles(lambda: generate(rng, geo, "singles"), 60, geo)
    test = fresh_puzzles(lambda: generate(rng, geo, "singles"), 20, geo, exclude=pool)
    assert check_disjoint({"pool": pool, "test": test}, geo) == {"pool": 60, "test": 20}
    planted = [*test[:-1], random_symmetry(*pool[7], random.Random(3), geo)]
    with pytest.raises(ValueError, match="1 puzzle.* of 'test' may be a symmetric image of one in 'pool'"):
        check_disjoint({"pool": pool, "validation": test[:5], "test": planted}, geo)


def test_fresh_puzzles_give_up_instead_of_hanging():
    geo = geometry(2, 2)
    one = _puzzles(geo, 1, "one")[0]
    with pytest.raises(ValueError, match="fresh 4x4 puzzles"):
        fresh_puzzles(lambda: one, 2, geo)


def test_the_split_hash_names_the_puzzles_in_order():
    geo = geometry(2, 2)
    pairs = _puzzles(geo, 3, "hash")
    assert split_hash(pairs) == split_hash(list(pairs)) and len(split_hash(pairs)) == 64
    assert split_hash(pairs[::-1]) != split_hash(pairs) and split_hash(pairs[:2]) != split_hash(pairs)
