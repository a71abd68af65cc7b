"""A resumed ``replace`` run is whole (issue 21): after a crash and ``--resume`` every file of the run equals the
uninterrupted run's, timing fields aside (validation.json kept 2 of 30 history entries)."""

from __future__ import annotations

import json

import pytest
import torch

from dihal_fast.replace import BridgeTrainConfig, train_bridge

TIMING = {"elapsed_s", "train_seconds_this_run", "seconds", "tokens_per_s"}
WORDS = [
    "the",
    "cat",
    "dog",
    "bird",
    "sat",
    "ran",
    "on",
    "under",
    "a",
    "mat",
    "tree",
    "house",
    "red",
    "blue",
    "small",
    "big",
    "and",
    "then",
    "it",
    "was",
    "happy",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    generator = torch.Generator().manual_seed(0)
    lines = [
        " ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (8,), generator=generator).tolist()) + "."
        for _ in range(300)
    ]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(lines) + "\n")
    return path


class _Crash(Exception):
    pass


def _without_timing(value, run: str):
    """``value`` without timing fields, with the run's own path written RUN (it names where, not what)."""
    if isinstance(value, dict):
        return {k: _without_timing(v, run) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [_without_timing(v, run) for v in value]
    return value.replace(run, "RUN") if isinstance(value, str) else value


def _run_files(run) -> dict[str, object]:
    """Every file of a run but its checkpoints: JSON and JSONL without timing fields, the rest as bytes."""
    files = {}
    for path in sorted(p for p in run.rglob("*") if p.is_file() and "checkpoints" not in p.parts):
        name = str(path.relative_to(run))
        if path.suffix == ".json":
            files[name] = _without_timing(json.loads(path.read_text()), str(run))
        elif path.suffix == ".jsonl":
            files[name] = [_without_timing(json.loads(line), str(run)) for line in path.read_text().splitlines()]
        elif path.suffix != ".png":  # the loss curve's pixels depend on the timing-free log only, but not byte-stably
            files[name] = path.read_bytes()
    return files


@pytest.mark.slow  # two bridge trainings: 40 s on 2 shared cores
def test_a_crashed_and_resumed_replace_run_equals_the_uninterrupted_one(tiny_checkpoints, corpus, tmp_path):
    config = BridgeTrainConfig(
        seq_len=16,
        batch_size=4,
        val_blocks=4,
        stats_blocks=8,
        steps=4,
        checkpoint_every=2,
        log_every=1,
        eval_every=2,
        warmup_steps=2,
        bridge={"width": 32, "heads": 2, "context_layers": 1, "time_dim": 16},
    )
    model = tiny_checkpoints["llama"]
    train_bridge(model, 1, corpus, tmp_path / "straight", config)

    def crash(info):
        if info.step == 3:  # after the step-2 checkpoint and validation: step 3's row is lost, as in a kill
            raise _Crash

    with pytest.raises(_Crash):
        train_bridge(model, 1, corpus, tmp_path / "resumed", config, callback=crash)
    train_bridge(model, 1, corpus, tmp_path / "resumed", config, resume=True)
    straight, resumed = _run_files(tmp_path / "straight"), _run_files(tmp_path / "resumed")
    assert [h["step"] for h in straight["validation.json"]["history"]] == [2, 4]
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert straight[name] == resumed[name], name
