"""The offline downstream tasks: the builders (deterministic, well-formed examples, the shipped files
rebuilt byte for byte from the shared data), the shipped package data and the runner's input checks.
lm-evaluation-harness itself is exercised in tests/test_lm_eval.py."""

from __future__ import annotations

import hashlib
import json
import re
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dihal_fast.evaluate import downstream, task_data
from dihal_fast.evaluate.task_data import TaskDataConfig, cloze_examples, lambada_examples

STORY = """Once upon a time there was a girl called Mia. Mia had a red kite. She loved the kite very much.

One day the wind was strong. Mia took her kite to the hill. The kite flew up high in the sky. Mia laughed.

Then the string broke! The kite flew away over the trees. Mia was sad. Her dad said they would find the kite.

They walked to the woods. They looked under every tree. At last Mia saw something red. It was her kite!

Mia hugged her dad. They went home with the kite. That night Mia dreamed of flying with her kite.
"""
SMALL = TaskDataConfig(n_per_source=1, min_context_words=8, max_context_words=60)


def _rows(name: str) -> list[dict]:
    return [
        json.loads(line) for line in (downstream.TASKS_DIR / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
    ]


def test_paragraph_and_sentence_spans():
    text = 'A b. C d!\n\n "E f?" G h\n'
    spans = task_data.paragraphs(text)
    assert [text[a:b] for a, b in spans] == ["A b. C d!", '"E f?" G h']
    assert [text[s.start : s.end] for s in task_data.sentences(text, spans)] == ["A b.", "C d!", '"E f?"', "G h"]


def test_lambada_examples_end_before_a_word_of_the_passage():
    examples = lambada_examples(
        STORY, TaskDataConfig(n_per_source=3, min_context_words=8, max_context_words=60), seed=0
    )
    assert len(examples) == 3
    for example in examples:
        word = example["target"]
        assert word.startswith(" ") and word[1:].isalpha() and word[1:].lower() not in task_data.FUNCTION_WORDS
        assert STORY[example["offset"] :].startswith(word[1:]) and STORY[: example["offset"] - 1].endswith(
            example["context"]
        )
        assert word[1:].lower() in re.findall(r"[a-z]+", example["context"].lower())
        assert 8 <= len(example["context"].split()) <= 60 and not example["context"][-1].isspace()
    assert [e["offset"] for e in examples] == sorted(e["offset"] for e in examples)


def test_cloze_examples_hold_the_true_next_sentence_once():
    settings = TaskDataConfig(
        n_per_source=2, min_context_words=8, max_context_words=60, n_choices=3, length_tolerance=1.0
    )
    for example in cloze_examples(STORY, settings, seed=0):
        true = example["choices"][example["label"]]
        assert len(example["choices"]) == 3 and len({c.lower() for c in example["choices"]}) == 3
        assert STORY[example["offset"] :].startswith(true)
        assert STORY[: example["offset"]].endswith(example["context"] + " ")
        assert all(c not in example["context"] for c in example["choices"] if c != true)


@given(seed=st.integers(0, 2**31 - 1))
def test_builders_are_functions_of_text_settings_and_seed(seed):
    assert lambada_examples(STORY, SMALL, seed) == lambada_examples(STORY, SMALL, seed)
    settings = TaskDataConfig(
        n_per_source=1, min_context_words=8, max_context_words=60, n_choices=3, length_tolerance=1.0
    )
    assert cloze_examples(STORY, settings, seed) == cloze_examples(STORY, settings, seed)


def test_too_few_examples_and_bad_settings_are_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"gives only \d+ LAMBADA-style examples, 1000 were asked for"):
        lambada_examples(STORY, TaskDataConfig(n_per_source=1000, min_context_words=8), seed=0)
    with pytest.raises(ValueError, match="n_choices >= 2"):
        TaskDataConfig(n_choices=1)
    with pytest.raises(ValueError, match="maximum is below its minimum"):
        TaskDataConfig(min_context_words=50, max_context_words=10)
    with pytest.raises(FileNotFoundError, match="missing.txt does not exist"):
        task_data.build_tasks([tmp_path / "missing.txt"], tmp_path / "out")


def test_build_tasks_writes_files_and_manifest(tmp_path):
    source = tmp_path / "story.txt"
    source.write_text(STORY, encoding="utf-8")
    settings = TaskDataConfig(
        n_per_source=1, min_context_words=8, max_context_words=60, n_choices=3, length_tolerance=1.0
    )
    manifest = task_data.build_tasks([source], tmp_path / "tasks", settings)
    assert manifest["sources"] == [
        {"name": "story.txt", "bytes": source.stat().st_size, "sha256": hashlib.sha256(source.read_bytes()).hexdigest()}
    ]
    for name in task_data.TASK_NAMES:
        data = (tmp_path / "tasks" / f"{name}.jsonl").read_bytes()
        assert manifest["files"][f"{name}.jsonl"] == {"sha256": hashlib.sha256(data).hexdigest(), "examples": 1}
        assert json.loads(data)["source"] == "story.txt"
    assert json.loads((tmp_path / "tasks" / "manifest.json").read_text()) == manifest


def test_shipped_tasks_are_package_data_with_a_matching_manifest():
    manifest = json.loads((downstream.TASKS_DIR / "manifest.json").read_text())
    assert [s["name"] for s in manifest["sources"]] == list(task_data.DEFAULT_SOURCES)
    assert {s["name"]: s["sha256"] for s in manifest["sources"]} == task_data.DEFAULT_SOURCES
    for name in downstream.LOCAL_TASKS:
        assert (downstream.TASKS_DIR / f"{name}.yaml").is_file()
        data = (downstream.TASKS_DIR / f"{name}.jsonl").read_bytes()
        assert manifest["files"][f"{name}.jsonl"]["sha256"] == hashlib.sha256(data).hexdigest()
        rows = _rows(name)
        assert len(rows) == 300 and {r["source"] for r in rows} == set(task_data.DEFAULT_SOURCES)
    assert all(0 <= r["label"] < len(r["choices"]) == 4 for r in _rows("dihal_cloze_local"))


def test_shipped_tasks_rebuild_byte_for_byte_from_the_shared_data(shared_data, tmp_path):
    sources = [shared_data / "text" / name for name in task_data.DEFAULT_SOURCES]
    manifest = task_data.build_tasks(sources, tmp_path)
    for name in downstream.LOCAL_TASKS:
        assert (tmp_path / f"{name}.jsonl").read_bytes() == (downstream.TASKS_DIR / f"{name}.jsonl").read_bytes()
    assert manifest == json.loads((downstream.TASKS_DIR / "manifest.json").read_text())


def test_task_names_parse_and_a_missing_harness_names_the_extra(monkeypatch):
    assert downstream.parse_tasks("a, b,,a") == ["a", "b"]
    assert downstream.parse_tasks(["a,b", "c"]) == ["a", "b", "c"] and downstream.parse_tasks(None) == []
    with pytest.raises(ValueError, match="names no task"):
        downstream.check_tasks(" , ")
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(ImportError, match=re.escape("pip install 'dihal_fast[lm_eval]'")):
        downstream.check_tasks("dihal_lambada_local")


def test_evaluate_tasks_without_the_harness_is_one_line_before_any_work(monkeypatch, tmp_path, capsys):
    from dihal_fast.cli import main

    monkeypatch.setitem(sys.modules, "lm_eval", None)
    out = tmp_path / "run"
    assert (
        main(["evaluate", "--hybrid", str(tmp_path / "no_hybrid"), "--out", str(out), "--tasks", "dihal_lambada_local"])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'dihal_fast[lm_eval]'" in err and not out.exists()
