"""Sudoku splits disjoint up to the training symmetries: the key is invariant under every symmetry training applies,
tells generated puzzles apart, catches a symmetric copy planted in a split, fresh draws avoid a pool, and the frozen
6x6 and 9x9 files (validation, test and 9x9's rated-puzzle test) keep their hashes and stay apart (from each other;
with -m slow, from the pools)."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from dihal_fast.tasks.data import load_sudoku_csv
from dihal_fast.tasks.sudoku import geometry, random_symmetry
from dihal_fast.tasks.sudoku_grade import generate
from dihal_fast.tasks.sudoku_splits import (
    SPLIT_NAMES,
    Pair,
    check_disjoint,
    draw_splits,
    fresh_puzzles,
    split_hash,
    symmetry_key,
    write_split_csv,
)
from dihal_fast.tasks.sudoku_task import generate_pool

BOXES = [(2, 2), (2, 3), (3, 3)]
DATA = Path(__file__).resolve().parents[1] / "bench" / "data"  # bench/make_sudoku_splits.py wrote its folders
FROZEN = {"sudoku6": (2, 3), "sudoku9": (3, 3)}  # folder -> box


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


def test_drawn_splits_avoid_the_pool_and_each_other_and_read_back(tmp_path):
    geo = geometry(2, 3)
    rng = random.Random("pool")
    pool = fresh_puzzles(lambda: generate(rng, geo, "singles"), 40, geo)
    splits = draw_splits(geo, 7, 4, exclude=pool)
    assert [level for _, level in splits["validation"]] == ["easy"] * 4 + ["hard"] * 4
    named = {name: [pair for pair, _ in rows] for name, rows in splits.items()}
    assert check_disjoint({"pool": pool, **named}, geo) == {"pool": 40, "validation": 8, "test": 8}
    assert draw_splits(geo, 7, 4, exclude=pool) == splits and draw_splits(geo, 8, 4, exclude=pool) != splits
    write_split_csv(tmp_path / "test.csv", splits["test"])
    records = load_sudoku_csv(tmp_path / "test.csv")
    assert [((r.puzzle, r.solution), r.level) for r in records] == splits["test"]


def _frozen(folder: str) -> dict[str, list[Pair]]:
    manifest = json.loads((DATA / folder / "splits.json").read_text())
    return {
        name: [(r.puzzle, r.solution) for r in load_sudoku_csv(DATA / folder / entry["file"])]
        for name, entry in manifest["splits"].items()
    }


@pytest.mark.parametrize("folder", FROZEN)
def test_the_frozen_splits_keep_their_hashes_and_share_no_puzzle(folder):
    manifest = json.loads((DATA / folder / "splits.json").read_text())
    splits = _frozen(folder)
    assert set(SPLIT_NAMES) <= set(splits)
    for name, entry in manifest["splits"].items():
        assert split_hash(splits[name]) == entry["split_hash"]
        assert hashlib.sha256((DATA / folder / entry["file"]).read_bytes()).hexdigest() == entry["sha256"]
        assert len(splits[name]) == sum(entry["sizes"].values())
    assert all(min(manifest["splits"][name]["sizes"].values()) >= 150 for name in SPLIT_NAMES)
    assert check_disjoint(splits, geometry(*FROZEN[folder])) == {name: len(rows) for name, rows in splits.items()}


@pytest.mark.slow
@pytest.mark.parametrize("folder", FROZEN)
def test_the_frozen_splits_share_no_puzzle_with_the_training_pools_of_seeds_0_1_2(folder):
    geo = geometry(*FROZEN[folder])
    pools = json.loads((DATA / folder / "splits.json").read_text())["excluded_pools"]
    assert pools["train_seeds"] == [0, 1, 2]
    pooled = [p for seed in pools["train_seeds"] for p in generate_pool(geo, pools["pool"], pools["difficulty"], seed)]
    check_disjoint({"training pools": pooled, **_frozen(folder)}, geo)
