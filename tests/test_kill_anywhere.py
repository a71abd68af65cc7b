"""Resume after a crash or a kill at any moment: a run that raised, or was SIGKILLed at a named point
(``DIHAL_TEST_KILL_AT``, the test hook of :mod:`dihal_fast.common.io`), and resumed gives every file of the
uninterrupted run, timing fields aside; a sweep's worker processes die with their parent.

The default suite kills ``replace`` at three points and a sweep's parent once; the grid over every point of
``replace``, ``hcdlm train`` and ``locate`` is ``slow``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dihal_fast.common.rundir import LOCK_NAME
from dihal_fast.replace import BridgeTrainConfig, train_bridge

TIMING = {"elapsed_s", "train_seconds_this_run", "train_seconds", "seconds", "tokens_per_s", "timings", "started"}
WORDS = "the cat dog bird sat ran on under a mat tree house red blue small big and then it was happy".split()
DIHAL = str(Path(sys.executable).with_name("dihal"))  # the installed command
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "DIHAL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
CONFIG = {
    "seq_len": 16,
    "batch_size": 4,
    "val_blocks": 4,
    "stats_blocks": 8,
    "steps": 4,
    "checkpoint_every": 2,
    "log_every": 1,
    "eval_every": 2,
    "warmup_steps": 2,
    "bridge": {"width": 32, "heads": 2, "context_layers": 1, "time_dim": 16},
}
# Trains the bridge of CONFIG (argv: model, corpus, out) on one thread, resuming what is there.
TRAIN = """
import json, sys, torch
from dihal_fast.replace import BridgeTrainConfig, train_bridge
torch.set_num_threads(1)
train_bridge(sys.argv[1], 1, sys.argv[2], sys.argv[3], BridgeTrainConfig(**json.loads(sys.argv[4])), resume=True)
"""


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


def without_timing(value, run: str):
    """``value`` without timing fields, with the run's own path written RUN (it names where, not what)."""
    if isinstance(value, dict):
        return {k: without_timing(v, run) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [without_timing(v, run) for v in value]
    return _stable(value.replace(run, "RUN")) if isinstance(value, str) else value


def _stable(name: str) -> str:
    """``name`` with the random suffix of a collection's parts folder (a fresh one per checkpoint) written ``*``."""
    return re.sub(r"\.parts-[0-9a-f]{8}", ".parts-*", name)


def run_files(run: Path, checkpoints: bool = False) -> dict[str, object]:
    """Every file of a run (its checkpoints only when asked): JSON and JSONL without timing fields, the run
    marker's creation time aside, PNG plots left out (their pixels are not byte-stable), the rest as bytes."""
    files: dict[str, object] = {}
    for path in sorted(p for p in run.rglob("*") if p.is_file()):
        name = _stable(str(path.relative_to(run)))
        if (not checkpoints and "checkpoints" in path.parts) or path.suffix == ".png" or path.name == LOCK_NAME:
            continue
        if path.suffix == ".json":
            data = without_timing(json.loads(path.read_text()), str(run))
            files[name] = {k: v for k, v in data.items() if k != "created"} if isinstance(data, dict) else data
        elif path.suffix == ".jsonl":
            files[name] = [without_timing(json.loads(line), str(run)) for line in path.read_text().splitlines()]
        else:
            files[name] = path.read_bytes()
    return files


def assert_same_run(straight: Path, resumed: Path, checkpoints: bool = False) -> None:
    expected, got = run_files(straight, checkpoints), run_files(resumed, checkpoints)
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name] == expected[name], name


@pytest.fixture(scope="module")
def straight(tiny_checkpoints, corpus, tmp_path_factory):
    """The uninterrupted replace run (one thread, as the killed runs)."""
    out = tmp_path_factory.mktemp("straight") / "run"
    _train_here(tiny_checkpoints["llama"], corpus, out)
    return out


def _train_here(model, corpus, out) -> None:
    """Train (or resume) CONFIG's bridge in this process, on one thread as the killed runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_bridge(model, 1, corpus, out, BridgeTrainConfig(**CONFIG), resume=True)
    finally:
        torch.set_num_threads(threads)


def _train(model, corpus, out, kill_at: str | None) -> subprocess.CompletedProcess:
    env = {**ENV, **({"DIHAL_TEST_KILL_AT": kill_at} if kill_at else {})}
    argv = [sys.executable, "-c", TRAIN, str(model), str(corpus), str(out), json.dumps(CONFIG)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)


def _kill_and_resume(tiny_checkpoints, corpus, straight, tmp_path, point):
    out = tmp_path / "run"
    killed = _train(tiny_checkpoints["llama"], corpus, out, point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    _train_here(tiny_checkpoints["llama"], corpus, out)
    assert_same_run(straight, out)


@pytest.mark.parametrize("point", ["statistics", "checkpoint:2", "export"])
def test_replace_killed_at_a_point_resumes_to_the_uninterrupted_run(
    tiny_checkpoints, corpus, straight, tmp_path, point
):
    _kill_and_resume(tiny_checkpoints, corpus, straight, tmp_path, point)


@pytest.mark.slow  # eleven more kills and resumes: about 3 CPU-minutes
@pytest.mark.parametrize(
    "point",
    [
        "data",
        "step:1",
        "step:3",
        "validation:1",
        "validation:2",
        "checkpoint:1",
        *(f"write:{n}" for n in (1, 3, 6, 9, 14)),
    ],
)
def test_replace_killed_anywhere_resumes_to_the_uninterrupted_run(tiny_checkpoints, corpus, straight, tmp_path, point):
    _kill_and_resume(tiny_checkpoints, corpus, straight, tmp_path, point)


class _Crash(Exception):
    pass


@pytest.mark.slow  # two more bridge trainings
def test_a_crashed_and_resumed_replace_run_equals_the_uninterrupted_one(tiny_checkpoints, corpus, straight, tmp_path):
    def crash(info):
        if info.step == 3:  # after the step-2 checkpoint and validation: step 3's row is lost, as in a kill
            raise _Crash

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises(_Crash):
            train_bridge(tiny_checkpoints["llama"], 1, corpus, tmp_path, BridgeTrainConfig(**CONFIG), callback=crash)
    finally:
        torch.set_num_threads(threads)
    _train_here(tiny_checkpoints["llama"], corpus, tmp_path)
    assert [h["step"] for h in json.loads((straight / "validation.json").read_text())["history"]] == [2, 4]
    assert_same_run(straight, tmp_path)


def _hcdlm(out: Path, kill_at: str | None = None) -> subprocess.CompletedProcess:
    from dihal_fast.testing.tiny import HCDLM_TINY_ARGS

    env = {**ENV, **({"DIHAL_TEST_KILL_AT": kill_at} if kill_at else {})}
    argv = [DIHAL, "hcdlm", "train", "--task", "sudoku", "--sudoku-box", "2x2"]
    argv += ["--sudoku-pool", "20", "--steps", "4", "--checkpoint-every", "2", "--out", str(out), *HCDLM_TINY_ARGS]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # five hcdlm trainings in subprocesses
@pytest.mark.parametrize("point", ["step:3", "checkpoint:2", "write:4"])
def test_hcdlm_train_killed_anywhere_resumes_to_the_uninterrupted_run(tmp_path, point):
    assert _hcdlm(tmp_path / "straight").returncode == 0
    assert _hcdlm(tmp_path / "run", point).returncode == -signal.SIGKILL
    resumed = _hcdlm(tmp_path / "run")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_run(tmp_path / "straight", tmp_path / "run")


def _locate(model, corpus, out: Path, *extra: str, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**ENV, **({"DIHAL_TEST_KILL_AT": kill_at} if kill_at else {})}
    argv = [DIHAL, "locate", "--model", str(model), "--corpus", str(corpus)]
    argv += ["--out", str(out), "--max-tokens", "2048", "--seq-len", "16", "--batch-size", "4", "--repeats", "2"]
    argv += ["--sample-size", "40", "--checkpoint-every", "8", *extra]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # locate in subprocesses
@pytest.mark.parametrize("point", ["write:2", "write:5", "write:9", "write:14"])
def test_locate_killed_anywhere_resumes_to_the_uninterrupted_run(tiny_checkpoints, corpus, tmp_path, point):
    model = tiny_checkpoints["llama"]
    assert _locate(model, corpus, tmp_path / "straight").returncode == 0
    assert _locate(model, corpus, tmp_path / "run", kill_at=point).returncode == -signal.SIGKILL
    started = (tmp_path / "run" / "collect" / "config.json").is_file()  # killed before it: a plain rerun
    resumed = _locate(model, corpus, tmp_path / "run", *(["--resume"] if started else []))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_run(tmp_path / "straight", tmp_path / "run", checkpoints=True)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def _sweep(model, corpus, out: Path) -> subprocess.Popen:
    argv = [DIHAL, "sweep", "--model", str(model), "--corpus", str(corpus)]
    argv += ["--out", str(out), "--workers", "2", "--layers", "1", "2", "3", "--budget-steps", "400"]
    argv += ["--score-repeats", "2", "--score-sample", "40", "--max-tokens", "2048", "--seq-len", "16"]
    argv += ["--batch-size", "2", "--val-blocks", "2"]
    return subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _workers(out: Path, timeout_s: float = 300) -> list[int]:
    """The worker pids recorded in the sweep's layer locks (waits until both workers are recorded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = set()
        for lock in out.glob(f"layer_*/{LOCK_NAME}"):
            try:
                pids.update(json.loads(lock.read_text()).get("writers", []))
            except (OSError, ValueError):
                pass
        if len(pids) == 2:
            return sorted(pids)
        time.sleep(0.2)
    pytest.fail("the sweep's workers were not recorded in time")


@pytest.mark.parametrize("how", [signal.SIGKILL, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_sweep_workers_die_with_their_parent(tiny_checkpoints, corpus, tmp_path, how):
    out = tmp_path / "sweep"
    parent = _sweep(tiny_checkpoints["llama"], corpus, out)
    try:
        workers = _workers(out)
        assert all(_alive(pid) for pid in workers)
        parent.send_signal(how)
        _, stderr = parent.communicate(timeout=60)
        deadline = time.monotonic() + 15
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in workers if _alive(pid)], "a sweep worker outlived its parent"
        if how == signal.SIGTERM:
            assert parent.returncode == 130 and "--resume" in stderr.splitlines()[-1]
            assert not list(out.rglob(LOCK_NAME))
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
