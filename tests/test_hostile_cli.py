"""Hostile input to every command (issue 21): each case is refused at once with exactly one error line, exit
status 2, no traceback and no run directory left behind; the Python API refuses the same values with the same
message. The table holds the cases the issue lists; test_hostile_configs.py generates values for every field."""

from __future__ import annotations

import json
import math
import os
import time

import pytest

from dihal_fast.backbone.config import BackboneModelConfig, BackboneTrainConfig
from dihal_fast.cli import main
from dihal_fast.collect.config import CollectConfig
from dihal_fast.common.assets import default_model_dir
from dihal_fast.common.checkpoint_config import check_checkpoint_config
from dihal_fast.common.validation import INT_LIMIT
from dihal_fast.hcdlm.config import HCDLMModelConfig, HCDLMTrainConfig, SampleConfig
from dihal_fast.pipeline import LocateConfig, ReplaceConfig
from dihal_fast.pipeline.generate_stage import GenerateConfig
from dihal_fast.replace.config import BridgeTrainConfig
from dihal_fast.tasks.registry import TaskConfig
from dihal_fast.testing.cli import error_line, run_cli
from dihal_fast.testing.tiny import HCDLM_TINY_ARGS
from dihal_fast.train.settings import LoopSettings

TINY = HCDLM_TINY_ARGS
SUDOKU = ["hcdlm", "train", "--task", "sudoku", "--sudoku-box", "2x2", "--sudoku-pool", "20", "--steps", "1"]
COUNTDOWN = ["hcdlm", "train", "--task", "countdown", "--countdown-numbers", "3", "--steps", "1"]

# (argv after the command's own required parts, text the one error line must contain)
TRAIN_CASES = [
    (["--lr", "inf"], "--lr must be a finite number"),
    (["--lr", "1e12"], "--lr must be <= 1.0"),
    (["--lr", "0"], "--lr must be > 0"),
    (["--lambda-recon", "nan"], "--lambda-recon must be a finite number"),
    (["--heads", "0"], "--heads must be >= 1"),
    (["--heads", "3"], "multiple of heads"),
    (["--threads", "-1"], "--threads must be >= 0"),
    (["--dropout", "nan"], "--dropout must be a finite number"),
    (["--dropout", "1"], "--dropout must be < 1"),
    (["--grad-clip", "nan"], "--grad-clip must be a finite number"),
    (["--max-minutes", "nan"], "--max-minutes must be a finite number"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--seed", str(2**70)], "--seed must be <= "),
    (["--seed", "1.5"], "invalid int value"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--batch-size", "-1"], "--batch-size must be >= 1"),
    (["--ema", "1"], "--ema-decay must be < 1"),
    (["--sudoku-box", "1x9"], "box shape"),
    (["--sudoku-pool", "0"], "--sudoku-pool must be >= 1"),
    (["--device", "foo"], "not a torch device"),
    (["--heads", "abc"], "invalid int value"),
    (["--timesteps", "0"], "--timesteps must be >= 1"),
    (["--mask-aux-rate", "1.5"], "--mask-aux-rate must be <= 1"),
]
COUNTDOWN_CASES = [
    (["--countdown-len", "1"], "--countdown-len 1 cannot hold a solution"),
    (["--countdown-numbers", "7"], "--countdown-numbers must be <= 6"),
    (["--countdown-numbers", "1"], "--countdown-numbers must be >= 2"),
]
LOCATE_CASES = [
    (["--reservoir-size", "0"], "--reservoir-size must be >= 1"),
    (["--max-batches", "-1"], "--max-batches must be >= 1"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--ridge", "nan"], "--ridge must be a finite number"),
    (["--k", "0"], "--k must be >= 1"),
    (["--seq-len", "1"], "--seq-len must be >= 2"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1"),
    (["--device", "cuda:7"], "CUDA"),
]
GENERATE_CASES = [
    (["--nfe", "0"], "--nfe must be >= 1"),
    (["--nfe", "-1"], "--nfe must be >= 1"),
    (["--temperature", "nan"], "--temperature must be a finite number"),
    (["--top-p", "0"], "--top-p must be > 0"),
    (["--n-samples", "0"], "--n-samples must be >= 1"),
    (["--device", "foo"], "not a torch device"),
]
REPLACE_CASES = [
    (["--lr", "inf"], "--lr must be a finite number"),
    (["--lr", "1e12"], "--lr must be <= 1.0"),
    (["--w-rec", "nan"], "--w-rec must be a finite number"),
    (["--batch-size", "-1"], "--batch-size must be >= 1"),
    (["--device", "foo"], "not a torch device"),
    (["--ema-decay", "nan"], "--ema-decay must be a finite number"),
]


def _refused(argv: list[str], expected: str, capsys, run=None) -> None:
    start = time.perf_counter()
    assert run_cli(argv) == 2, argv
    assert expected in error_line(capsys)
    assert time.perf_counter() - start < 20, f"{argv} took {time.perf_counter() - start:.0f} s to be refused"
    if run is not None:
        assert not os.path.exists(run), f"{argv} left {run} behind"


@pytest.mark.parametrize("extra, expected", TRAIN_CASES)
def test_hcdlm_train_refuses_at_once(tmp_path, capsys, extra, expected):
    _refused([*SUDOKU, *TINY, "--out", str(tmp_path / "run"), *extra], expected, capsys, tmp_path / "run")


@pytest.mark.parametrize("extra, expected", COUNTDOWN_CASES)
def test_hcdlm_train_countdown_refuses_impossible_settings_at_once(tmp_path, capsys, extra, expected):
    _refused([*COUNTDOWN, *TINY, "--out", str(tmp_path / "run"), *extra], expected, capsys, tmp_path / "run")


@pytest.mark.parametrize("extra, expected", LOCATE_CASES)
def test_locate_refuses_before_loading_anything(tmp_path, capsys, extra, expected):
    _refused(
        ["locate", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "run"), *extra],
        expected,
        capsys,
        tmp_path / "run",
    )


@pytest.mark.parametrize("extra, expected", GENERATE_CASES)
def test_generate_refuses_before_loading_the_model(tmp_path, capsys, extra, expected):
    _refused(["generate", "--model", str(tmp_path / "none"), *extra], expected, capsys)


@pytest.mark.parametrize("extra, expected", REPLACE_CASES)
def test_replace_refuses_before_loading_the_model(tmp_path, capsys, extra, expected):
    _refused(
        ["replace", "--model", str(tmp_path / "none"), "--layer", "1", "--out", str(tmp_path / "run"), *extra],
        expected,
        capsys,
        tmp_path / "run",
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 1-step Sudoku run and a 1-step Countdown run to solve and evaluate with."""
    root = tmp_path_factory.mktemp("runs")
    assert main([*SUDOKU, *TINY, "--out", str(root / "sudoku")]) == 0
    assert main([*COUNTDOWN, *TINY, "--out", str(root / "countdown")]) == 0
    return root


SOLVE_CASES = [
    (["--temperature", "nan"], "--temperature must be a finite number"),
    (["--cfg-weight", "nan"], "--cfg-weight must be a finite number"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--batch-size", "-1"], "--batch-size must be >= 1"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--device", "foo"], "not a torch device"),
]
EVAL_CASES = [
    (["--limit", "0"], "--limit must be >= 1"),
    (["--samples", "0"], "--samples must be >= 1"),
    (["--steps-sweep", "0,5"], "--steps-sweep must be >= 1"),
    (["--evaluator", "/nonexistent/evaluator"], "no checkpoint at /nonexistent/evaluator"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--temperature", "nan"], "--temperature must be a finite number"),
]


@pytest.mark.parametrize("extra, expected", SOLVE_CASES)
def test_hcdlm_solve_refuses_bad_sampling_values(runs, capsys, extra, expected):
    _refused(["hcdlm", "solve", str(runs / "sudoku"), "1.3..2.1..2.....", *extra], expected, capsys)


@pytest.mark.parametrize("extra, expected", EVAL_CASES)
def test_hcdlm_eval_refuses_bad_values_before_the_work(runs, tmp_path, capsys, extra, expected):
    data = tmp_path / "puzzles.csv"
    data.write_text("puzzle,solution\n1.3..2.1..2.....,1234341221434321\n")
    _refused(
        ["hcdlm", "eval", str(runs / "sudoku"), "--data", str(data), "--out", str(tmp_path / "r.json"), *extra],
        expected,
        capsys,
    )
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    "problem, expected",
    [
        (",".join(str(v) for v in range(1, 13)) + ",50", "longer than this model's"),
        ("1,2,3,4,5,6,7,50", "longer than this model's"),
    ],
)
def test_hcdlm_solve_of_a_huge_countdown_problem_is_refused_at_once(runs, capsys, problem, expected):
    """12 numbers used to run an exhaustive search for minutes."""
    _refused(["hcdlm", "solve", str(runs / "countdown"), problem], expected, capsys)


def test_the_countdown_solver_refuses_more_than_six_numbers():
    from dihal_fast.tasks.countdown import Problem, solve

    with pytest.raises(ValueError, match="2-6 numbers, got 12"):
        solve(Problem(tuple(range(1, 13)), 50))


@pytest.mark.parametrize("value", ["abc", "0", "-3", "1.5", ""])
def test_bad_thread_settings_are_one_line(monkeypatch, capsys, value):
    monkeypatch.setenv("DIHAL_NUM_THREADS", value)
    if value == "":
        assert main(["info"]) == 0  # empty = unset
        return
    assert main(["info"]) == 2
    assert "DIHAL_NUM_THREADS must be a positive integer or 'auto'" in error_line(capsys)


class _FullDisk:
    """A stdout whose writes fail as on a full disk (``> /dev/full``) or a closed pipe (``| head``)."""

    def __init__(self, error: OSError) -> None:
        self.error = error

    def write(self, text: str) -> int:
        raise self.error

    def flush(self) -> None:
        raise self.error

    def fileno(self) -> int:
        raise OSError("no descriptor")


def test_a_full_disk_on_stdout_is_one_line(monkeypatch, capsys):
    import sys

    error = OSError(28, "No space left on device")
    monkeypatch.setattr(sys, "stdout", _FullDisk(error))
    assert main(["info"]) == 1
    assert error.strerror in error_line(capsys)


def test_a_closed_pipe_on_stdout_ends_the_command_quietly(monkeypatch, capsys):
    import sys

    monkeypatch.setattr(sys, "stdout", _FullDisk(BrokenPipeError(32, "Broken pipe")))
    assert main(["info"]) == 0
    assert capsys.readouterr().err == ""


def test_a_bug_shows_its_traceback_without_debug(monkeypatch):
    """Only a refusal (DihalError) or the environment (OSError) is one line; anything else is a bug."""
    from dihal_fast.cli import info

    monkeypatch.delenv("DIHAL_DEBUG", raising=False)
    monkeypatch.setattr(info, "run", lambda args: {}["missing"])
    with pytest.raises(KeyError):
        main(["info"])


def test_debug_shows_the_traceback(monkeypatch):
    monkeypatch.setenv("DIHAL_DEBUG", "1")
    with pytest.raises(ValueError, match="--heads must be >= 1"):
        main([*SUDOKU, "--heads", "0", "--out", "/nonexistent/run"])


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: HCDLMTrainConfig(seed=1.5), "--seed must be an integer"),
        (lambda: HCDLMTrainConfig(seed=-1), "--seed must be >= 0"),
        (lambda: HCDLMTrainConfig(seed=2**70), f"--seed must be <= {INT_LIMIT}"),
        (lambda: HCDLMTrainConfig(lr=math.inf), "--lr must be a finite number"),
        (lambda: HCDLMTrainConfig(steps=True), "--steps must be an integer"),
        (lambda: HCDLMModelConfig(heads=0), "--heads must be >= 1"),
        (lambda: HCDLMModelConfig(kind="gpt"), "--model must be one of"),
        (lambda: SampleConfig(temperature=math.nan), "--temperature must be a finite number"),
        (lambda: TaskConfig(countdown_numbers=[3, "4"]), "--countdown-numbers must be an integer"),
        (lambda: LocateConfig(reservoir_size=0), "--reservoir-size must be >= 1"),
        (lambda: LocateConfig(layers=[1.0]), "--layers must be an integer"),
        (lambda: GenerateConfig(nfe=0), "--nfe must be >= 1"),
        (lambda: BridgeTrainConfig(lr=1e12), "--lr must be <= 1.0"),
        (lambda: BridgeTrainConfig(device="cuda:3"), "CUDA"),
        (lambda: ReplaceConfig(layer=0), "--layer must be >= 1"),
        (lambda: ReplaceConfig(layer=True), "--layer must be an integer"),
        (lambda: BackboneModelConfig(rope_theta=math.nan), "--rope-theta must be a finite number"),
        (lambda: BackboneTrainConfig(corpus=["a.txt"], lr=1e12), "--lr must be <= 1.0"),
        (lambda: BackboneTrainConfig(corpus=["a.txt"], grad_clip=math.nan), "--grad-clip must be a finite number"),
        (lambda: LoopSettings(steps=1, batch_size=1, lr=math.inf, warmup_steps=0), "lr must be a finite number"),
        (lambda: LoopSettings(steps=1, batch_size=1, lr=1.0, warmup_steps=-1), "warmup_steps must be >= 0"),
        (lambda: CollectConfig(model="m", corpus=["c"], reservoir_size=0), "reservoir_size must be >= 1"),
        (lambda: CollectConfig(model="m", corpus=["c"], seed=1.5), "seed must be an integer"),
    ],
)
def test_the_python_api_refuses_the_same_values(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_locate_backend_cuda_without_a_gpu_is_refused_before_the_collection(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the CUDA backend is available")
    _refused(
        ["locate", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "run"), "--backend", "cuda"],
        "CUDA",
        capsys,
        tmp_path / "run",
    )


# --- a checkpoint config.json that cannot be used: a wrong-typed shape field, a --seq-len beyond the context ------


def _checkpoint(tmp_path, name: str = "model", **fields) -> str:
    """A copy of the shipped backbone's config.json (nothing else: a command that got past the check would fail
    to load weights) with ``fields`` replaced."""
    folder = tmp_path / name
    folder.mkdir()
    config = json.loads((default_model_dir() / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return str(folder)


def _hybrid(tmp_path, max_positions: int) -> str:
    """A hybrid directory's config.json of a backbone with ``max_positions`` positions."""
    return _checkpoint(tmp_path, "hybrid", model_type="dihal_hybrid", max_position_embeddings=max_positions)


BAD_FIELDS = [
    ("num_hidden_layers", "four"),
    ("hidden_size", 128.0),
    ("num_attention_heads", True),
    ("vocab_size", -1),
    ("num_key_value_heads", [2]),
    ("max_position_embeddings", "128"),
]


@pytest.mark.parametrize("field, value", BAD_FIELDS)
@pytest.mark.parametrize("command", ["locate", "replace", "evaluate"])
def test_a_wrong_typed_shape_field_is_refused_naming_file_and_field(tmp_path, capsys, command, field, value):
    model = _checkpoint(tmp_path, **{field: value})
    run = tmp_path / "run"
    argv = {
        "locate": ["locate", "--model", model, "--out", str(run)],
        "replace": ["replace", "--model", model, "--layer", "1", "--out", str(run)],
        "evaluate": ["evaluate", "--hybrid", model, "--out", str(run)],
    }[command]
    _refused(argv, f"model/config.json: field {field!r} is {value!r}, expected a whole number", capsys, run)


@pytest.mark.parametrize(
    "argv",
    [
        ["locate", "--seq-len", "1000"],
        ["replace", "--layer", "1", "--seq-len", "1000"],
        ["sweep", "--seq-len", "1000"],
        ["demo", "--seq-len", "1000"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_seq_len_beyond_the_backbones_context_is_refused_at_once(tmp_path, capsys, argv):
    model = _checkpoint(tmp_path, max_position_embeddings=128)
    run = tmp_path / "run"
    expected = f"--seq-len 1000 exceeds the model's max_position_embeddings (128 positions, in {model}/config.json)"
    _refused([*argv, "--model", model, "--out", str(run)], expected, capsys, run)


def test_evaluate_seq_len_beyond_the_hybrids_context_is_refused_at_once(tmp_path, capsys):
    hybrid = _hybrid(tmp_path, 128)
    run = tmp_path / "run"
    _refused(
        ["evaluate", "--hybrid", hybrid, "--out", str(run), "--seq-len", "1000"],
        "--seq-len 1000 exceeds the model's max_position_embeddings (128 positions",
        capsys,
        run,
    )


def test_the_context_under_either_name_bounds_seq_len_and_zero_means_none(tmp_path):
    gpt2 = _checkpoint(tmp_path, "gpt2", max_position_embeddings=None, n_positions=64)
    with pytest.raises(ValueError, match="exceeds the model's n_positions [(]64 positions"):
        check_checkpoint_config(gpt2, 65)
    assert check_checkpoint_config(gpt2, 64).name == "gpt2"
    unbounded = _checkpoint(tmp_path, "unbounded", max_position_embeddings=0)
    assert check_checkpoint_config(unbounded, 10**6).name == "unbounded"
    assert check_checkpoint_config(None, 128) == default_model_dir()  # the shipped backbone passes


def test_a_config_that_is_not_an_object_is_refused(tmp_path):
    folder = tmp_path / "list"
    folder.mkdir()
    (folder / "config.json").write_text("[]")
    with pytest.raises(ValueError, match="holds list, expected a JSON object"):
        check_checkpoint_config(folder)
