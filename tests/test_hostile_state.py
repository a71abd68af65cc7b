"""Loaded HC-DLM state is checked (issue 21): a damaged puzzle pool, stream, random state or run config is one
line naming the file, never a traceback or a silently different run; impossible Sudoku pools end, not hang."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from dihal_fast.cli import main
from dihal_fast.tasks.sudoku import geometry
from dihal_fast.tasks.sudoku_task import generate_pool
from dihal_fast.testing.cli import error_line
from dihal_fast.testing.tiny import HCDLM_TINY_ARGS
from dihal_fast.train.checkpoint import latest_checkpoint

TINY = HCDLM_TINY_ARGS
TRAIN = ["hcdlm", "train", "--task", "sudoku", "--sudoku-box", "2x2", "--sudoku-pool", "20", *TINY]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-step Sudoku run with a checkpoint, copied by each test before it damages a file."""
    run = tmp_path_factory.mktemp("hcdlm") / "run"
    assert main([*TRAIN, "--out", str(run), "--steps", "2"]) == 0
    return run


def _edit_json(path, change):
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


POOL_DAMAGE = [
    lambda pool: 7,
    lambda pool: pool[:-1],
    lambda pool: [[p, s[:-1]] for p, s in pool],
    lambda pool: [[p, [1] * len(s)] for p, s in pool],  # not a solution
    lambda pool: [[p, [float(v) for v in s]] for p, s in pool],
    lambda pool: [[[9] * len(p), s] for p, s in pool],  # digit out of range
]
STREAM_DAMAGE = [
    ("stream.json", lambda s: {**s, "task_rng": 5}),
    ("stream.json", lambda s: {**s, "task_rng": [3, s["task_rng"][1][:10], None]}),
    ("rng_rank0.json", lambda s: {**s, "numpy": ["MT19937", [1, 2, 3], 0, 0, 0.0]}),
    ("rng_rank0.json", lambda s: {**s, "python": [3, [1, 2], None]}),
    ("rng_rank0.json", lambda s: []),
    ("config.json", lambda s: []),  # the run config that resume, eval and solve read
    ("config.json", lambda s: {**s, "model": "big"}),
]


@pytest.mark.parametrize("damage", POOL_DAMAGE)
def test_a_damaged_puzzle_pool_is_one_line_naming_it(trained, tmp_path, capsys, damage):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    _edit_json(run / "puzzle_pool.json", damage)
    capsys.readouterr()
    assert main([*TRAIN, "--out", str(run), "--steps", "4"]) == 2
    assert "puzzle_pool.json is damaged" in error_line(capsys)


@pytest.mark.parametrize("name, damage", STREAM_DAMAGE)
def test_a_damaged_stream_random_state_or_config_is_one_line(trained, tmp_path, capsys, name, damage):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    _edit_json(latest_checkpoint(run) / name, damage)
    capsys.readouterr()
    assert main([*TRAIN, "--out", str(run), "--steps", "4"]) == 2
    assert error_line(capsys)
    if name == "config.json":
        assert main(["hcdlm", "solve", str(run), "1.3..2.1..2.....", "--steps", "2"]) == 2
        assert "config.json" in error_line(capsys)


def test_a_pool_larger_than_the_grid_allows_ends_with_a_clear_error():
    """1x2 boxes: only a few distinct 2x2 puzzles exist; asking for 3,000 used to loop forever."""
    start = time.perf_counter()
    with pytest.raises(ValueError, match="only .* distinct singles 2x2 puzzles found.*--sudoku-pool"):
        generate_pool(geometry(1, 2), 3000, "singles", seed=0)
    assert time.perf_counter() - start < 30


def test_a_difficulty_the_grid_cannot_have_is_one_line(tmp_path, capsys):
    code = main(
        [
            "hcdlm",
            "train",
            "--task",
            "sudoku",
            "--sudoku-box",
            "2x2",
            "--sudoku-difficulty",
            "hard",
            "--sudoku-pool",
            "5",
            "--out",
            str(tmp_path / "run"),
            "--steps",
            "1",
            *TINY,
        ]
    )
    assert code == 2
    assert "hard" in error_line(capsys)
