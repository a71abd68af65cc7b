"""Real-data loaders, format detection and the tasks' token encodings."""

from __future__ import annotations

import random

import pytest

from dihal_fast.tasks.countdown import Problem, check_strict
from dihal_fast.tasks.countdown_task import CountdownTask
from dihal_fast.tasks.data import detect_format, load_countdown_jsonl, load_sudoku_csv
from dihal_fast.tasks.sudoku_task import SudokuTask, generate_pool, parse_box
from dihal_fast.tasks.text_task import TextTask, tokenize_files


def test_detect_format(shared_data, tmp_path):
    assert detect_format(shared_data / "sudoku_kaggle3m_curated5000.csv") == "sudoku"
    assert detect_format(shared_data / "countdown.jsonl") == "countdown"
    assert detect_format(shared_data / "text" / "tinystories.valid.txt") == "text"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": 1}\n')
    with pytest.raises(ValueError, match="'nums' and 'target'"):
        detect_format(bad)
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="expected a Sudoku CSV"):
        detect_format(other)
    with pytest.raises(FileNotFoundError):
        detect_format(tmp_path / "missing.csv")


def test_loaders_reject_bad_rows(tmp_path):
    csv_path = tmp_path / "s.csv"
    csv_path.write_text("puzzle,solution\n" + "." * 81 + "," + "1" * 81 + "\n")
    with pytest.raises(ValueError, match=r"s.csv:2: the solution is not a valid grid"):
        load_sudoku_csv(csv_path)
    csv_path.write_text("puzzle,solution\n" + "." * 80 + "," + "1" * 81 + "\n")
    with pytest.raises(ValueError, match=r"s.csv:2: .*81 cells"):
        load_sudoku_csv(csv_path)
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"nums": [1, "x", 3], "target": 4}\n')
    with pytest.raises(ValueError, match=r"c.jsonl:1: 'nums' must be a list of positive integers"):
        load_countdown_jsonl(jsonl)


def test_real_sudoku_levels(shared_data):
    records = load_sudoku_csv(shared_data / "sudoku_kaggle3m_curated5000.csv")
    assert {r.level for r in records} == {"Beginner", "Easy", "Medium", "Hard", "Expert"}


def test_sudoku_encoding_round_trip():
    task = SudokuTask(2, 3)
    task.pool = generate_pool(task.geo, 5, "singles", seed=0)
    context, target = task.train_batch(random.Random(0), 4)
    assert context.shape == target.shape == (4, 36) and int(target.max()) <= 5 and int(context.max()) <= 6
    puzzle, solution = task.pool[0]
    example = task.example(puzzle, solution, "easy")
    assert task.score(example, [v - 1 for v in solution]) == {"correct": True, "valid": True, "blank_cells": 1.0}
    blanks = [i for i, v in enumerate(puzzle) if v == 0]
    wrong = [v - 1 for v in solution]
    wrong[blanks[0]] = (wrong[blanks[0]] + 1) % 6
    scores = task.score(example, wrong)
    assert scores["correct"] is False and scores["valid"] is False
    assert scores["blank_cells"] == pytest.approx(1 - 1 / len(blanks))
    assert parse_box("2x3") == (2, 3)
    with pytest.raises(ValueError):
        parse_box("3by3")
    with pytest.raises(ValueError, match="6x6"):
        task.encode(tuple([0] * 81))


def test_countdown_encoding_round_trip():
    task = CountdownTask((3, 4))
    context, target = task.train_batch(random.Random(0), 8)
    assert context.shape == (8, task.context_len) and target.shape == (8, task.spec.target_len)
    problem = Problem((58, 11, 80, 83), 81)
    example = task.example(problem, "cd4")
    solution = "80-58=22,22/11=2,83-2=81"
    assert task.render(task.encode_solution(solution)) == solution and check_strict(problem, solution)
    assert task.score(example, task.encode_solution(solution)) == {"correct": True, "loose": True, "true_steps": 1.0}
    assert task.score(example, task.encode_solution("80+1=81")) == {"correct": False, "loose": True, "true_steps": 1.0}
    assert task.score(example, task.encode_solution("80+1=82,3*3=9")) == {
        "correct": False,
        "loose": False,
        "true_steps": 0.5,
    }
    assert task.score(example, task.encode_solution("80+1")) == {"correct": False, "loose": False, "true_steps": 0.0}
    with pytest.raises(ValueError, match="longer than"):
        task.encode_solution("1+1=2," * 10)


def test_text_task_windows(tiny_checkpoints, shared_data):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoints["gpt2"])
    tokens = tokenize_files(tokenizer, [shared_data / "text" / "tinystories.valid.txt"], max_chars=5000)
    task = TextTask(tokenizer, seq_len=32, tokens=tokens)
    context, target = task.train_batch(random.Random(0), 3)
    assert context.shape == (3, 0) and target.shape == (3, 32)
    assert isinstance(task.render(target[0].tolist()), str)
    with pytest.raises(ValueError, match="fewer than seq_len"):
        TextTask(tokenizer, seq_len=10_000, tokens=tokens)
