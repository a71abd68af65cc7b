"""One ``--device`` / ``--dtype`` handling for every command (issue 20): ``auto`` is the default of every command
that takes them, and a device this machine lacks (``--device cuda`` without a GPU) is refused with one error line,
exit status 2, before any run directory exists."""

from __future__ import annotations

import argparse
import os

import pytest
import torch

from dihal_fast.cli import build_parser, main
from dihal_fast.common.devices import DTYPE_CHOICES
from dihal_fast.pipeline import EvaluateConfig
from dihal_fast.testing.tiny import HCDLM_TINY_ARGS


def leaf_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """``(command words, parser)`` of every runnable (sub-)command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen = set()
            for name, child in action.choices.items():
                if id(child) not in seen:  # an alias (train = replace) is the same parser
                    seen.add(id(child))
                    yield from leaf_commands(child, (*prefix, name))
            return
    yield prefix, parser


def option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in parser._actions if flag in a.option_strings), None)


COMMANDS = {words: parser for words, parser in leaf_commands(build_parser())}
WITH_DEVICE = sorted(words for words, parser in COMMANDS.items() if option(parser, "--device"))


def test_every_command_that_loads_or_trains_a_model_takes_device():
    expected = {
        ("backbone", "train"),
        ("generate",),
        ("locate",),
        ("replace",),
        ("hcdlm", "train"),
        ("hcdlm", "eval"),
        ("hcdlm", "solve"),
        ("evaluate",),
        ("sweep",),
        ("demo",),
    }
    assert set(WITH_DEVICE) == expected


@pytest.mark.parametrize("words", WITH_DEVICE, ids=" ".join)
def test_device_defaults_to_auto_and_says_so(words, capsys):
    action = option(COMMANDS[words], "--device")
    assert action.default == "auto" and "auto" in action.help and "cuda" in action.help
    with pytest.raises(SystemExit):
        main([*words, "--help"])
    assert "(default: auto)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("words", sorted(w for w, p in COMMANDS.items() if option(p, "--dtype")), ids=" ".join)
def test_dtype_defaults_to_the_checkpoints_own(words):
    action = option(COMMANDS[words], "--dtype")
    assert action.default == "auto" and tuple(action.choices) == DTYPE_CHOICES


def test_every_command_with_a_checkpoint_dtype_takes_dtype():
    with_dtype = {words for words, parser in COMMANDS.items() if option(parser, "--dtype")}
    assert with_dtype == {("generate",), ("locate",), ("replace",), ("evaluate",), ("sweep",), ("demo",)}


@pytest.fixture(scope="module")
def hcdlm_run(tmp_path_factory):
    """A one-step HC-DLM run on 2x2 Sudoku: what ``hcdlm eval`` / ``hcdlm solve`` open before the device."""
    out = tmp_path_factory.mktemp("hcdlm") / "run"
    argv = ["hcdlm", "train", "--task", "sudoku", "--sudoku-box", "2x2", "--sudoku-pool", "20", "--steps", "1"]
    assert main([*argv, *HCDLM_TINY_ARGS, "--device", "cpu", "--out", str(out)]) == 0
    return out


def _argv(words: tuple[str, ...], tmp_path, hcdlm_run) -> list[str]:
    """The command with its required arguments (paths that need not exist: the device is refused first)."""
    required = {
        "--out": str(tmp_path / "run"),
        "--corpus": str(tmp_path / "corpus.txt"),
        "--task": "sudoku",
        "--data": str(tmp_path / "data.jsonl"),
        "--hybrid": str(tmp_path / "hybrid"),
    }
    argv = list(words)
    if words in (("hcdlm", "eval"), ("hcdlm", "solve")):
        argv.append(str(hcdlm_run))
        argv += ["1234"] if words[-1] == "solve" else []
    for action in COMMANDS[words]._actions:
        if action.required and action.option_strings:
            argv += [action.option_strings[0], required[action.option_strings[0]]]
    if words == ("replace",):
        argv += ["--layer", "1"]
    return argv


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a CUDA device here: --device cuda is valid")
@pytest.mark.parametrize("words", WITH_DEVICE, ids=" ".join)
def test_device_cuda_without_a_gpu_is_one_line(words, tmp_path, capsys, hcdlm_run):
    capsys.readouterr()
    try:
        status = main([*_argv(words, tmp_path, hcdlm_run), "--device", "cuda"])
    except SystemExit as exc:  # argparse's usage error (a flag checked while parsing)
        status = exc.code
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert status == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "device cuda" in errors[0] and "no CUDA device" in errors[0], errors[0]
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("device", "meta", "only cpu and cuda"),
        ("device", "gpu0", "not a torch device"),
        ("dtype", "int8", "--dtype must be one of"),
        ("device_map", "everywhere", "--device-map must be one of"),
        ("evaluator_dtype", "int8", "--evaluator-dtype must be one of"),
        ("task_limit", 0, "--task-limit must be >= 1"),
    ],
)
def test_evaluate_config_refuses_bad_placement_when_built(field, value, message):
    with pytest.raises(ValueError, match=message):
        EvaluateConfig(hybrid="h", **{field: value})


def test_evaluate_config_defaults_are_auto():
    config = EvaluateConfig(hybrid="h")
    assert (config.device, config.dtype, config.device_map) == ("auto", "auto", "none")
