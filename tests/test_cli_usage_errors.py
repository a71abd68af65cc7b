"""A usage error names the (sub-)command it was made in, so the --help it points to lists the right options."""

from __future__ import annotations

import pytest

from dihal_fast.testing.cli import error_line, run_cli


@pytest.mark.parametrize(
    "argv, command, wrong",
    [
        (["locate", "--layer", "3", "5"], "dihal locate", "--layer 3 5"),
        (["hcdlm", "train", "--task", "sudoku", "--step", "2"], "dihal hcdlm train", "--step 2"),
        (["backbone", "list", "--zz"], "dihal backbone list", "--zz --out RUN"),  # list takes no --out
        (["info", "extra"], "dihal info", "extra --out RUN"),
    ],
)
def test_an_unknown_argument_names_the_command_it_was_given_to(tmp_path, capsys, argv, command, wrong):
    run = tmp_path / "run"
    assert run_cli([*argv, "--out", str(run)]) == 2
    wrong = wrong.replace("RUN", str(run))
    assert error_line(capsys) == f"{command}: error: unrecognized arguments: {wrong} (see {command} --help)"
    assert not run.exists()


def test_a_missing_required_option_is_still_the_sub_command_s_own_line(capsys):
    assert run_cli(["locate"]) == 2
    assert error_line(capsys).startswith("dihal locate: error: the following arguments are required: --out")
