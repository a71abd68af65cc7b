"""One writer per run directory (two real processes), usable-path checks for ``--out``."""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dihal_fast.cli import main
from dihal_fast.common import atomic_write_json
from dihal_fast.common.io import MARKER_NAME, make_directories
from dihal_fast.common.rundir import LOCK_NAME, RunDirectoryBusy, check_output_file, read_marker, run_directory

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


# Runs dihal's main on argv[1:] and prints whether torch was imported by then, then the exit status.
EARLY = """
import sys
from dihal_fast.cli import main
code = main(sys.argv[1:])
print("torch" in sys.modules, code)
"""


@pytest.mark.parametrize("command", RUN_COMMANDS)
def test_a_held_run_directory_is_refused_before_torch_is_imported(holder, command):
    run, proc = holder
    done = subprocess.run(
        [sys.executable, "-c", EARLY, *command, "--out", str(run)], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["False", "2"], done.stderr[-2000:]
    assert f"pid {proc.pid}" in done.stderr and done.stderr.startswith(f"dihal {command[0]}: error: run directory")


def test_the_early_check_knows_every_command_whose_out_is_a_run_directory():
    from dihal_fast.cli import RUN_DIRECTORY_COMMANDS, build_parser

    def walk(parser, prefix):
        for action in parser._actions:
            if "--out" in action.option_strings and (action.help or "").startswith("run directory"):
                yield prefix
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, f"{prefix} {name}".strip())

    assert set(walk(build_parser(), "")) == set(RUN_DIRECTORY_COMMANDS)


@pytest.mark.parametrize(
    ("argv", "found"),
    [
        (["--local-rank", "0", "sweep", "--out", "S"], ("sweep", "S")),
        (["-v", "hcdlm", "train", "--task", "sudoku", "--out=R"], ("hcdlm", "R")),
        (["train", "--layer", "1"], ("train", None)),
        (["hcdlm", "eval", "R", "--out", "E.json"], None),
        (["generate", "--out", "S.json"], None),
        (["replace", "--out", "R", "--help"], None),
    ],
)
def test_run_directory_out_reads_the_command_and_out_from_the_words(argv, found):
    from dihal_fast.cli import run_directory_out

    assert run_directory_out(argv) == found


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


def test_another_rank_that_runs_ahead_leaves_the_fresh_directory_to_rank_0(tmp_path, monkeypatch):
    """Under torchrun rank 1 reaches the inputs check before rank 0 has claimed a fresh --out: it must write
    nothing there (its marker, or the marker's temporary file, made rank 0 refuse the directory as foreign)."""
    from dihal_fast.pipeline.run_inputs import check_inputs

    run = tmp_path / "run"
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with run_directory(run, "dihal replace") as path:
        check_inputs(path, "", {"layer": 1})
        assert os.listdir(path) == []
    monkeypatch.setenv("RANK", "0")
    with run_directory(run, "dihal replace") as path:  # rank 0 claims it afterwards
        check_inputs(path, "", {"layer": 1})
        assert read_marker(path)["inputs"] == {"": {"layer": 1}}


def test_a_run_recorded_before_a_config_field_existed_resumes_at_the_fields_legacy_value(tmp_path):
    from dihal_fast.errors import DihalValueError
    from dihal_fast.pipeline.run_inputs import check_inputs, replace_inputs
    from dihal_fast.replace import BridgeTrainConfig

    config = BridgeTrainConfig()
    inputs = replace_inputs(None, 1, ["c.txt"], config)
    older = {**inputs, "train": {k: v for k, v in inputs["train"].items() if k != "copied_init"}}
    legacy = {"train": config.legacy}
    with run_directory(tmp_path / "run", "dihal replace") as path:
        check_inputs(path, "", older)  # what the older release recorded
        check_inputs(path, "", inputs, legacy=legacy)  # the new field at its legacy value: the same run
        with pytest.raises(DihalValueError, match="copied_init 'backbone' -> 'random'"):
            check_inputs(path, "", replace_inputs(None, 1, ["c.txt"], BridgeTrainConfig(copied_init="random",
                         train_copied_layers=True)), legacy=legacy)  # fmt: skip
        with pytest.raises(DihalValueError, match="copied_init None -> 'backbone'"):
            check_inputs(path, "", inputs)  # without the legacy values a new field differs


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


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("command", RUN_COMMANDS)
def test_a_fresh_run_refuses_a_directory_it_did_not_create_and_changes_nothing(tmp_path, capsys, command):
    run = tmp_path / "x"
    (run / "hybrid").mkdir(parents=True)
    (run / "hybrid" / "notes.txt").write_text("mine")
    (run / "validation.json").write_text('{"mine": 1}')
    before = _snapshot(run)
    code = main([*command, "--out", str(run)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "no dihal run created it" in err and "--resume" in err, err
    assert _snapshot(run) == before  # no marker, no lock, nothing overwritten or appended


@pytest.mark.parametrize(
    "argv",
    [
        ["locate", "--out", ""],
        ["replace", "--layer", "1", "--out", ""],
        ["sweep", "--out", " "],
        ["hcdlm", "train", "--task", "sudoku", "--out", ""],
        ["locate", "--out", "RUN", "--corpus", ""],
        ["replace", "--layer", "1", "--out", "RUN", "--model", ""],
        ["replace", "--from-locate", "", "--out", "RUN"],
        ["generate", "--prompt", "x", "--out", ""],
    ],
)
def test_an_empty_path_is_refused_in_one_line(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:  # a usage error of argparse (a flag whose type refuses "")
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "empty string" in err, err
    assert not list(tmp_path.iterdir())  # nothing written into the current directory


def test_resume_adopts_an_unmarked_run_and_overwrite_clears_only_its_own_files(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "log.jsonl").write_text("{}\n")  # a run of an earlier version: no marker
    with pytest.raises(ValueError, match="no dihal run created it"), run_directory(run, "dihal replace"):
        pytest.fail("entered an unmarked directory")
    with (
        pytest.raises(ValueError, match="at most one of --resume"),
        run_directory(run, "x", resume=True, overwrite=True),
    ):
        pytest.fail("entered with both flags")
    with run_directory(run, "dihal replace", resume=True):
        atomic_write_json(run / "result.json", {"done": True})
    assert read_marker(run)["written"] == ["checkpoints", "log.jsonl", "result.json"]
    (run / "NOTES").write_text("the user's")  # added after the run
    with run_directory(run, "dihal replace", overwrite=True):
        assert sorted(p.name for p in run.iterdir()) == [MARKER_NAME, LOCK_NAME, "NOTES"]
        atomic_write_json(run / "result.json", {"again": True})
    assert (run / "NOTES").read_text() == "the user's" and read_marker(run)["written"] == ["result.json"]
    with run_directory(run, "dihal replace"):  # marked: a plain rerun enters (the stage decides about resuming)
        pass


def test_overwrite_never_clears_a_directory_no_run_created(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "thesis.tex").write_text("years of work")
    with pytest.raises(ValueError, match="only a run's own files"), run_directory(run, "dihal locate", overwrite=True):
        pytest.fail("entered")
    assert (run / "thesis.tex").read_text() == "years of work"


def test_entries_are_listed_before_they_are_written_and_stage_folders_belong_to_their_run(tmp_path):
    run = tmp_path / "demo"
    with run_directory(run, "dihal demo"):
        with run_directory(run / "locate", "dihal locate"):
            atomic_write_json(run / "locate" / "locate.json", {})
        (run / "replace").mkdir()
        (run / "replace" / "stray.txt").write_text("a folder of the run, made by hand")
        with run_directory(run / "replace", "dihal replace"):  # inside the held run: the run's own
            make_directories(run / "replace" / "checkpoints")
    assert read_marker(run)["written"] == ["locate", "replace"]
    assert read_marker(run / "locate")["written"] == ["locate.json"]
    assert read_marker(run / "replace")["written"] == ["checkpoints", "stray.txt"]


def test_a_refused_fresh_run_leaves_no_directory_behind(tmp_path):
    run = tmp_path / "new"
    with pytest.raises(RuntimeError), run_directory(run, "dihal locate"):
        raise RuntimeError("refused before writing")
    assert not run.exists()


def test_sigterm_inside_a_run_stops_it_in_one_line_naming_resume_and_releases_the_lock(tmp_path, capsys, monkeypatch):
    import dihal_fast.replace

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        pytest.fail("SIGTERM did not stop the command")

    monkeypatch.setattr(dihal_fast.replace, "train_bridge", terminated)
    run = tmp_path / "run"
    assert main(["replace", "--layer", "1", "--out", str(run)]) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("dihal replace: interrupted;") and "--resume" in err and str(run) in err
    assert not (run / LOCK_NAME).exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is the block's only


def test_a_rerun_waits_for_the_helpers_of_a_killed_run_then_refuses(tmp_path, monkeypatch):
    from dihal_fast.common import rundir

    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    run = tmp_path / "run"
    run.mkdir()
    record = {"pid": dead.pid, "host": socket.gethostname(), "command": "dihal sweep", "writers": [helper.pid]}
    (run / LOCK_NAME).write_text(json.dumps(record))
    monkeypatch.setattr(rundir, "WRITERS_GRACE_S", 0.3)
    try:
        with pytest.raises(RunDirectoryBusy, match=f"still written by pid\\(s\\) \\[{helper.pid}\\]"):
            with run_directory(run, "dihal sweep"):
                pytest.fail("shared the directory with a live writer")
    finally:
        helper.kill()
        helper.wait()
    with run_directory(run, "dihal sweep"):  # the helper is gone: taken over
        pass


# Starts a helper that dies with this process (argv[1]: where to write its pid), then waits.
PARENT = """
import multiprocessing, sys, time
from dihal_fast.common.rundir import die_with_parent

def helper(parent):
    die_with_parent(parent)
    time.sleep(60)

if __name__ == "__main__":
    import os
    child = multiprocessing.get_context("spawn").Process(target=helper, args=(os.getpid(),))
    child.start()
    time.sleep(1.0)
    open(sys.argv[1], "w").write(str(child.pid))
    time.sleep(60)
"""


def test_a_helper_process_dies_with_its_parent(tmp_path):
    script, pid_file = tmp_path / "parent.py", tmp_path / "pid"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), str(pid_file)])
    try:
        deadline = time.monotonic() + 60
        while not pid_file.is_file() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the helper did not start"
            time.sleep(0.1)
        child = int(pid_file.read_text())
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{child}").exists(), "the helper outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
