"""One writer per run directory (two real processes), usable-path checks for ``--out``."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dihal_fast.cli import main
from dihal_fast.common import atomic_write_json
from dihal_fast.common.rundir import LOCK_NAME, RunDirectoryBusy, check_output_file, run_directory

# Holds RUN (argv[1]) until its stdin closes; says "locked" once it holds it.
HOLDER = """
import sys
from dihal_fast.common.rundir import run_directory
with run_directory(sys.argv[1], "dihal replace"):
    print("locked", flush=True)
    sys.stdin.read()
"""
# Every command that writes a run directory (--out RUN is added), with arguments that would fail later.
RUN_COMMANDS = [
    ["locate", "--corpus", "missing.txt"],
    ["replace", "--layer", "1"],
    ["sweep"],
    ["demo"],
    ["evaluate", "--hybrid", "missing"],
    ["backbone", "train", "--corpus", "missing.txt"],
    ["hcdlm", "train", "--task", "sudoku"],
]


@pytest.fixture
def holder(tmp_path):
    """A separate Python process holding ``tmp_path / "run"``."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    yield run, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_second_writer_stops_at_once_naming_the_holder(holder):
    run, proc = holder
    with pytest.raises(RunDirectoryBusy) as info:
        with run_directory(run, "dihal locate"):
            pytest.fail("entered a run directory another process holds")
    message = str(info.value)
    assert "\n" not in message
    assert f"pid {proc.pid}" in message and socket.gethostname() in message and "dihal replace" in message
    record = json.loads((run / LOCK_NAME).read_text())
    assert record["pid"] == proc.pid  # the refused writer changed nothing


@pytest.mark.parametrize("command", RUN_COMMANDS)
def test_every_command_refuses_a_held_run_directory(holder, capsys, command):
    run, proc = holder
    code = main([*command, "--out", str(run)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and f"pid {proc.pid}" in err and "in use" in err


def test_lock_is_released_when_the_holder_ends(holder):
    run, proc = holder
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    assert not (run / LOCK_NAME).exists()
    with run_directory(run, "dihal locate"):
        assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert not (run / LOCK_NAME).exists()


def test_lock_of_a_killed_process_is_taken_over_with_a_warning(holder, caplog):
    run, proc = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert (run / LOCK_NAME).is_file()  # left behind, naming the dead holder
    with caplog.at_level(logging.WARNING, logger="dihal_fast.common.rundir"):
        with run_directory(run, "dihal locate"):
            assert json.loads((run / LOCK_NAME).read_text())["command"] == "dihal locate"
    assert f"pid {proc.pid}" in caplog.text and "gone" in caplog.text


def test_other_ranks_of_a_job_do_not_lock(holder, monkeypatch):
    run, _ = holder
    monkeypatch.setenv("RANK", "1")
    with run_directory(run, "dihal locate") as path:
        assert path == run


def test_without_file_locks_the_recorded_holder_is_checked(holder, monkeypatch, caplog):
    run, proc = holder

    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with pytest.raises(RunDirectoryBusy, match=f"pid {proc.pid}.*no file locks"):
        with run_directory(run, "dihal locate"):
            pass
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    with caplog.at_level(logging.WARNING, logger="dihal_fast.common.rundir"):
        with run_directory(run, "dihal locate"):
            pass
    assert "does not support file locks" in caplog.text and f"pid {proc.pid}" in caplog.text


def test_unusable_run_directories_are_refused(tmp_path):
    existing = tmp_path / "report.txt"
    existing.write_text("not a run\n")
    with pytest.raises(ValueError, match="is an existing file"):
        with run_directory(existing, "dihal locate"):
            pass
    with pytest.raises(ValueError, match=f"{existing} is a file"):
        with run_directory(existing / "run", "dihal locate"):
            pass
    assert existing.read_text() == "not a run\n"
    with pytest.raises(ValueError, match="run directory /proc is not writable"):  # not even for root
        with run_directory("/proc", "dihal locate"):
            pass
    with pytest.raises(ValueError, match="run directory /proc/dihal-test/run cannot be created"):
        with run_directory("/proc/dihal-test/run", "dihal locate"):
            pass


@pytest.mark.parametrize("command", RUN_COMMANDS)
def test_out_that_is_a_file_is_one_line_error(tmp_path, capsys, command):
    existing = tmp_path / "taken"
    existing.write_text("keep me\n")
    code = main([*command, "--out", str(existing)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "existing file" in err and str(existing) in err
    assert existing.read_text() == "keep me\n"


def test_output_file_checks_fail_before_the_work(tmp_path):
    assert check_output_file(tmp_path / "new" / "deeper" / "report.json") == tmp_path / "new" / "deeper" / "report.json"
    with pytest.raises(ValueError, match="is a directory"):
        check_output_file(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=f"{blocker} is a file"):
        check_output_file(blocker / "report.json")
    unwritable = Path("/proc/dihal-test/report.json")  # no file can be created under /proc, even by root
    with pytest.raises(ValueError, match=f"--out {unwritable} cannot be written"):
        check_output_file(unwritable)


def test_unwritable_report_file_fails_before_the_work_naming_it(capsys):
    unwritable = "/proc/dihal-test/samples.json"
    code = main(["generate", "--model", "/nonexistent/model", "--out", unwritable])  # the model is never loaded
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and f"--out {unwritable} cannot be written" in err
    with pytest.raises(OSError, match=f"cannot write {unwritable}"):
        atomic_write_json(unwritable, {})  # a late failure names the file asked for, not its temporary
