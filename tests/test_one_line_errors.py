"""Hostile input that used to print a traceback (or be read as something else) is one line, or no line where
the user's own tool ended the output: abbreviated options, a closed pipe, nested JSON, odd environment values,
loose types, a read-only file system, a locate stopped by a bad corpus."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dihal_fast.cli import main
from dihal_fast.common.assets import default_corpus, default_model_dir
from dihal_fast.common.devices import parse_device_map
from dihal_fast.common.io import read_json
from dihal_fast.common.json_input import MAX_JSON_DEPTH, json_depth, parse_json
from dihal_fast.common.seeding import seed_everything
from dihal_fast.errors import DihalError
from dihal_fast.testing.cli import error_line, run_cli

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "argv, wrong",
    [
        (["locate", "--layer", "3", "5"], "--layer"),  # would be --layers
        (["hcdlm", "train", "--task", "sudoku", "--step", "2"], "--step"),  # would be --steps
        (["replace", "--lay", "1"], "--lay"),
    ],
)
def test_an_abbreviated_option_is_refused_not_guessed(tmp_path, capsys, argv, wrong):
    run = tmp_path / "run"
    assert run_cli([*argv, "--out", str(run)]) == 2
    assert f"unrecognized arguments: {wrong}" in error_line(capsys)
    assert not run.exists()


def test_a_closed_stdout_ends_the_command_quietly():
    """`dihal info | head -c0`: exit status 0 and nothing on stderr."""
    command = f"{sys.executable} -c 'import sys; from dihal_fast.cli import main; sys.exit(main())'"
    shell = f"set -o pipefail; {command} info | head -c0"
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")


def test_a_library_logger_that_prints_to_stdout_goes_to_stderr(capsys):
    """DeepSpeed's logger has a stdout handler; once the command started, its records reach stderr only, and its
    CPU banner (logged when save_pretrained imports DeepSpeed) none at all without --deepspeed."""
    library = logging.getLogger("DeepSpeed")
    handler = logging.StreamHandler(sys.stdout)  # what deepspeed.utils.logging adds when it is imported
    library.addHandler(handler)
    try:
        assert main(["info"]) == 0
        capsys.readouterr()
        library.warning("Using a ZeRO stage.")
        library.warning("Setting accelerator to CPU. If you have GPU or other accelerator, ...")
        out, err = capsys.readouterr()
        assert out == "" and "Using a ZeRO stage." in err and "Setting accelerator" not in err
    finally:
        library.removeHandler(handler)


def test_replace_prints_only_its_json_line_on_stdout(monkeypatch, capsys):
    from dihal_fast.cli import replace as cli_replace

    class Report(dict):
        hybrid_dir = Path("run/hybrid")

    validation = {"layer": 1, "bridge_loss": 0.5, "hybrid_ppl": 9.0, "backbone_ppl": 8.0, "kl": 0.1, "other": 3}
    monkeypatch.setattr("dihal_fast.pipeline.replace", lambda config, out: Report(validation=validation))
    monkeypatch.setattr(cli_replace, "dataclass_from_options", lambda cls, args: None)
    assert cli_replace.run(type("Args", (), {"out": "run"})()) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["layer"] == 1 and len(out.splitlines()) == 1
    assert "hybrid written to run/hybrid" in err


@pytest.mark.parametrize("value", ["²", "٣", "1²"])
def test_a_non_ascii_digit_thread_count_is_one_line_not_an_import_error(monkeypatch, capsys, value):
    env = {**os.environ, "DIHAL_NUM_THREADS": value}
    imported = subprocess.run([sys.executable, "-c", "import dihal_fast"], env=env, capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    monkeypatch.setenv("DIHAL_NUM_THREADS", value)
    assert main(["info"]) == 2
    assert "DIHAL_NUM_THREADS must be a positive integer or 'auto'" in error_line(capsys)


# --- nested JSON, wherever the package parses it ------------------------------------------------------------


def test_json_nesting_is_bounded_without_recursion():
    assert json_depth(json.loads("[" * 500 + "]" * 500)) == 500
    assert json_depth(3) == 0 and json_depth({"a": [1, {"b": []}]}) == 4
    assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, "x") is not None
    for depth in (MAX_JSON_DEPTH + 1, 100_000):
        with pytest.raises(DihalError, match="x is not valid JSON [(]nested deeper than 100 levels"):
            parse_json("[" * depth + "]" * depth, "x")


def test_a_nested_file_read_as_json_is_one_line(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text('{"parts": ' + DEEP + "}")
    with pytest.raises(DihalError, match="manifest.json is not valid JSON [(]nested deeper"):
        read_json(path, "collection checkpoint manifest")


def test_a_nested_device_map_is_one_short_line():
    with pytest.raises(DihalError, match="nested deeper than 100 levels") as caught:
        parse_device_map('{"model": ' + DEEP + "}")
    assert len(str(caught.value)) < 300


@pytest.mark.parametrize("contents", ['{"a": ' + DEEP + "}", "[]", "[1, 2]"], ids=["nested", "list", "numbers"])
@pytest.mark.parametrize("command", ["locate", "generate"])
def test_a_model_config_that_is_not_a_shallow_object_is_one_line(tmp_path, capsys, contents, command):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(contents)
    run = tmp_path / "run"
    argv = [command, "--model", str(model), *(["--out", str(run)] if command == "locate" else [])]
    assert run_cli(argv) == 2
    line = error_line(capsys)
    assert "nested deeper than 100 levels" in line or "holds list, expected a JSON object" in line
    assert not run.exists()


# --- loose types and environment refusals -------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1.5, "3", True, None, -1, 2**63])
def test_seed_everything_refuses_what_would_mean_another_seed(seed):
    with pytest.raises(DihalError, match="seed must be"):
        seed_everything(seed)


def test_seed_everything_takes_numpy_integers():
    import numpy as np

    seed_everything(np.int64(7))


def test_a_locate_report_whose_layer_is_true_is_refused(tmp_path):
    from dihal_fast.pipeline.replace_stage import _from_locate

    (tmp_path / "locate.json").write_text(json.dumps({"selected_layer": True, "model": None}))
    with pytest.raises(DihalError, match="has no integer 'selected_layer' [(]got True[)]"):
        _from_locate(str(tmp_path))


def test_a_read_only_file_system_is_an_environment_error(tmp_path, monkeypatch, capsys):
    """Exit status 1 (the environment), not 2 (bad input), as the README says."""

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    assert run_cli(["locate", "--out", str(tmp_path / "run")]) == 1
    assert "cannot be created (Read-only file system)" in error_line(capsys)


def test_a_missing_parent_stays_bad_input(capsys):
    assert run_cli(["locate", "--out", "/proc/no-such-dir/run"]) == 2
    assert "cannot be created (No such file or directory)" in error_line(capsys)


def test_a_locate_stopped_by_a_bad_corpus_lets_the_corrected_command_run(tmp_path, capsys):
    """The first run fails on its corpus before any batch; the same --out then takes the right corpus."""
    run, bad = tmp_path / "run", tmp_path / "bad.jsonl"
    bad.write_text('{"text": 3}\n')
    common = ["locate", "--model", str(default_model_dir()), "--out", str(run), "--max-batches", "1"]
    assert run_cli([*common, "--corpus", str(bad)]) == 2
    assert "expected an object with a string 'text' field" in error_line(capsys)
    assert run_cli([*common, "--corpus", str(default_corpus())]) == 3  # stopped by --max-batches, as asked
    assert (run / "collect" / "config.json").is_file()


GRID, PUZZLE = "1234341221434321", "1030341201434301"


@pytest.mark.parametrize(
    "contents, expected",
    [
        (f"puzzle,solution\n{PUZZLE}\n", ":2: expected puzzle and solution columns"),
        (f'puzzle,solution\n"{PUZZLE},{GRID}\n', ":2: expected puzzle and solution columns"),
        ("puzzle,solution\n" + "1" * 200_000 + f",{GRID}\n", "not a readable CSV after row 1 (field larger"),
        (f"level,puzzle\neasy,{PUZZLE}\n", ":2: expected puzzle and solution columns"),
    ],
    ids=["no_solution_column", "unterminated_quote", "field_over_the_limit", "wrong_header"],
)
def test_a_malformed_sudoku_csv_is_one_line(tmp_path, contents, expected):
    from dihal_fast.tasks.data import load_sudoku_csv

    path = tmp_path / "boards.csv"
    path.write_text(contents)
    with pytest.raises(DihalError, match=expected.replace("(", "[(]")):
        load_sudoku_csv(path)
    path.write_text(f"puzzle,solution\n{PUZZLE},{GRID}\n")
    assert len(load_sudoku_csv(path)) == 1
