"""Running the ``dihal`` command inside a test process and reading its one error line."""

from __future__ import annotations

from typing import Protocol


class _Captured(Protocol):
    err: str


class _Capture(Protocol):
    def readouterr(self) -> _Captured: ...


def error_line(capsys: _Capture) -> str:
    """The one error line the command printed on stderr (progress bars aside); fails on a traceback or on none."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def run_cli(argv: list[str]) -> int:
    """``dihal argv`` in this process: its exit status (argparse's usage errors exit through SystemExit)."""
    from dihal_fast.cli import main

    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
