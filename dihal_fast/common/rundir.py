"""One place every command's output goes through: usable-path checks and one writer per run directory.

``with run_directory(out, "dihal replace"):`` refuses an ``out`` that is a file (a one-line
``ValueError``), creates the directory and holds ``out/.dihal-run.lock`` for the whole block: an
exclusive ``flock`` on an open file, which the kernel drops however the process ends, plus the
holder's pid, host, command and start time written in the file. A second writer stops at once with
:class:`RunDirectoryBusy` naming the holder; a lock file left by a killed process is taken over with
a warning. The ``dihal`` command checks the lock before it imports the stages (:func:`refuse_busy`), so a
second writer stops in a fraction of a second. On a filesystem without ``flock`` (Lustre ``noflock``, some FUSE
mounts) the recorded holder is still checked: a live process on this host, or any process on another host,
keeps it.

Only global rank 0 (``RANK`` unset or 0, as torchrun and DeepSpeed set it) takes the lock: the other
processes of the same job write into the same directory under its protection.

A run directory is the run's own or refused. ``out/.dihal-run.json`` (the marker) names the command that
created it and lists each top-level entry the run wrote (before writing it) and the inputs each finished
part was made from (:mod:`dihal_fast.pipeline.reuse`). A directory that is neither missing, empty nor marked
is refused before any work (``resume=True``, the ``--resume`` flag, adopts one: a run of an earlier
dihal_fast, which wrote no marker); ``overwrite=True`` (``--overwrite``) first deletes the entries the marker
lists, and nothing else. A directory inside a run directory this process holds is that run's (``dihal demo``
and ``dihal sweep`` write their stages there).

While the block runs, SIGTERM stops the command as Ctrl-C does: the block unwinds (writes are atomic, so what
is on disk is whole), the lock is released, and :class:`RunInterrupted` says how to continue. Helper processes
that write into the directory (the sweep's workers) are recorded in the lock file
(:func:`register_writers`) and die with their parent (:func:`die_with_parent`): a later run waits for them
to be gone before it takes the directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from dihal_fast._version import __version__
from dihal_fast.common.io import (
    MARKER_NAME,
    atomic_write_json,
    check_directory_target,
    check_file_target,
    record_entry,
    run_root,
)
from dihal_fast.common.launch import launcher_env
from dihal_fast.errors import DihalError, DihalIOError, DihalValueError

logger = logging.getLogger(__name__)

LOCK_NAME = ".dihal-run.lock"
# flock errors meaning "this filesystem has no file locks", not "someone holds it".
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


# How an interrupted command that has a --resume flag says it continues.
RESUME_HINT = "rerun it with --resume to continue"
# The help of every --overwrite flag (run_directory(overwrite=True)).
OVERWRITE_HELP = "start the run again: first delete the files an earlier run wrote in the run directory (only those)"
# How long a new holder waits for the helper processes of a killed run to be gone.
WRITERS_GRACE_S = 10.0
# Lock descriptors this process holds, by absolute run-directory path.
_HELD: dict[str, int] = {}


class RunDirectoryBusy(DihalValueError):
    """Another process holds the run directory (the CLI prints it as one line, exit 2)."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a command inside its run directory; the message says how to continue."""


def refuse_empty_path(path: str | os.PathLike, option: str) -> None:
    """A one-line refusal of the empty string as a path (``Path("")`` is the current directory)."""
    if isinstance(path, str) and not path.strip():
        raise DihalValueError(f"{option} must be a path, got the empty string {path!r}")


def _nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest existing parent."""
    return next(p for p in (path, *path.absolute().parents) if p.exists())


def path_argument(text: str) -> Path:
    """An argparse ``type`` for path flags: the path, refusing the empty string (which would mean the current
    directory) as a usage error."""
    if not text.strip():
        import argparse

        raise argparse.ArgumentTypeError(f"expected a path, got the empty string {text!r}")
    return Path(text)


def check_run_directory(path: str | os.PathLike) -> Path:
    """``path`` as a :class:`Path`, or a one-line ``ValueError`` when it is empty or it or a parent is an existing
    file."""
    refuse_empty_path(path, "--out")
    path = Path(path)
    existing = _nearest_existing(path)
    if existing == path and not path.is_dir():
        raise DihalValueError(
            f"run directory {path} is an existing file; choose a directory (a new one or an earlier run's)"
        )
    if not existing.is_dir():
        raise DihalValueError(f"run directory {path} cannot be created: {existing} is a file, not a directory")
    return path


def check_output_file(path: str | os.PathLike, option: str = "--out") -> Path:
    """Fail before any work when ``path`` cannot receive a file: a directory, or no writable folder above it.

    Probes the nearest existing folder with a real temporary file (permission bits say nothing for
    root or read-only mounts); missing folders below it are created by the writer later.
    """
    refuse_empty_path(path, option)
    path = Path(path)
    if path.is_dir():
        raise DihalValueError(f"{option} {path} is a directory; give the path of a file to write")
    folder = _nearest_existing(path.absolute().parent)
    if not folder.is_dir():
        raise DihalValueError(f"{option} {path} cannot be written: {folder} is a file, not a directory")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        raise DihalValueError(
            f"{option} {path} cannot be written: no file can be created in {folder} ({exc.strerror})"
        ) from None
    return path


@contextlib.contextmanager
def run_directory(
    path: str | os.PathLike,
    command: str,
    files: tuple[str, ...] = (),
    folders: tuple[str, ...] = (),
    *,
    resume: bool | None = None,
    overwrite: bool = False,
    resume_hint: str = "rerun the same command to continue",
) -> Iterator[Path]:
    """Check and create the run directory ``path``, hold its lock (rank 0) and claim it while the block runs.

    ``command`` (e.g. ``"dihal replace"``) is recorded so that a refused second writer can say who
    holds the directory. ``files`` and ``folders`` are the outputs the command will write (relative
    to ``path``): one of the wrong kind, or a symbolic link, is refused now, before any work. While the
    block runs no file below ``path`` is written through a link (see :mod:`dihal_fast.common.io`).
    ``resume`` (the command's ``--resume``) adopts an unmarked directory, ``overwrite`` (``--overwrite``) clears
    the run's own files first (see the module doc); ``resume_hint`` ends the message of an interrupted run.
    Raises ``ValueError`` (``RunDirectoryBusy`` when it is held).
    """
    path = check_run_directory(path)
    if resume and overwrite:
        raise DihalValueError("give at most one of --resume (continue the run) and --overwrite (start it again)")
    check_outputs(path, files, folders)
    created = not path.exists()
    record_entry(path)  # a stage folder inside a run this process holds is that run's entry
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _os_refusal(exc)(f"run directory {path} cannot be created ({exc.strerror})") from exc
    if launcher_env().rank != 0:  # RANK, or SLURM_PROCID under srun without torchrun
        with run_root(path):
            yield path
        return
    lock_path = path / LOCK_NAME
    fd = _acquire(lock_path, command)
    _HELD[os.path.abspath(path)] = fd
    try:
        _claim(path, command, bool(resume), overwrite)
        with run_root(path, record=True), _interrupts_as_stop(path, resume_hint):
            yield path
    finally:
        _HELD.pop(os.path.abspath(path), None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path)  # while still holding the lock: see _acquire's inode check
        os.close(fd)
        if created and _entries(path) == [MARKER_NAME]:  # refused before writing: no empty directory behind
            with contextlib.suppress(OSError):
                (path / MARKER_NAME).unlink()
                path.rmdir()


def _entries(path: Path) -> list[str]:
    """The names in ``path`` but its lock file, sorted."""
    return sorted(name for name in os.listdir(path) if name != LOCK_NAME)


def read_marker(path: str | os.PathLike) -> dict:
    """The marker of run directory ``path`` (see the module doc); empty when it has none."""
    marker_path = Path(path) / MARKER_NAME
    if not marker_path.is_file():
        return {}
    try:
        marker = json.loads(marker_path.read_text())
    except (OSError, ValueError) as exc:
        raise DihalValueError(
            f"run marker {marker_path} is damaged ({exc}); move the directory's contents away or delete the marker "
            "if this is your run"
        ) from None
    if not isinstance(marker, dict) or not isinstance(marker.get("written", []), list):
        raise DihalValueError(f"run marker {marker_path} is not a dihal run marker; choose another --out")
    return marker


def update_marker(path: str | os.PathLike, **fields: object) -> dict:
    """Set ``fields`` in the marker of the run directory ``path`` (held by this process or inside one); returns it."""
    marker = {**read_marker(path), **fields}
    atomic_write_json(Path(path) / MARKER_NAME, marker)
    return marker


def _inside_held_run(path: Path) -> bool:
    target = os.path.abspath(path)
    return any(root != target and os.path.commonpath([root, target]) == root for root in _HELD)


def _claim(path: Path, command: str, resume: bool, overwrite: bool) -> None:
    """Make ``path`` this run's (see the module doc) or refuse it in one line."""
    marker, nested = read_marker(path), _inside_held_run(path)
    if not marker:
        foreign = [name for name in _entries(path) if name != MARKER_NAME]
        if foreign and not (resume or nested):
            shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
            raise DihalValueError(
                f"run directory {path} is not empty and no dihal run created it (it holds {shown}); choose a new or "
                "empty --out (--overwrite clears only a run's own files; a run directory of an earlier dihal_fast, "
                "which wrote no marker, continues with --resume)"
            )
        written = foreign  # adopted: --resume says these are the run's
    else:
        written = [name for name in marker.get("written", []) if isinstance(name, str)]
    if overwrite:
        _clear(path, written)
        written, marker = [], {}
    atomic_write_json(
        path / MARKER_NAME,
        {
            "command": marker.get("command", command),
            "dihal_fast": marker.get("dihal_fast", __version__),
            "created": marker.get("created", time.strftime("%Y-%m-%d %H:%M:%S")),
            "written": sorted(written),
            "inputs": marker.get("inputs", {}),
        },
    )


def _clear(path: Path, names: Iterable[str]) -> None:
    """Delete the entries ``names`` of ``path`` (files, folders, links: never what a link points to)."""
    for name in names:
        if name in (LOCK_NAME, MARKER_NAME) or os.sep in name or name in ("", ".", ".."):
            continue
        entry = path / name
        if entry.is_symlink() or entry.is_file():
            entry.unlink()
        elif entry.is_dir():
            shutil.rmtree(entry)
        logger.info("--overwrite: removed %s", entry)


@contextlib.contextmanager
def _interrupts_as_stop(path: Path, resume_hint: str) -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt while the block runs (the main thread only); an interrupt leaves the block
    as :class:`RunInterrupted` naming ``path`` and ``resume_hint`` (an enclosing run's block renames it)."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    except KeyboardInterrupt:  # from a stage folder's block too: the outermost run (the user's --out) names itself
        raise RunInterrupted(
            f"interrupted; {path} keeps what was complete (checkpoints, finished stages): {resume_hint}"
        ) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def check_outputs(run_dir: Path, files: tuple[str, ...], folders: tuple[str, ...]) -> None:
    """A ``ValueError`` now when an output of the command is a link or of the wrong kind (a folder where a file
    goes)."""
    for name in files:
        check_file_target(run_dir / name)
    for name in folders:
        check_directory_target(run_dir / name)


# What the environment refuses (the ``dihal`` command exits 1 on these); other errors name a bad path (exit 2).
_ENVIRONMENT_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.EIO}


def _os_refusal(exc: OSError) -> type[DihalError]:
    """:class:`DihalIOError` for a refusal by the environment (read-only file system, no permission, no
    space), else :class:`DihalValueError` (a path that cannot be one: a file in the way, no such parent)."""
    return DihalIOError if exc.errno in _ENVIRONMENT_ERRNOS else DihalValueError


def _acquire(lock_path: Path, command: str) -> int:
    """Open, lock and claim ``lock_path`` (never through a symbolic link); returns the descriptor that keeps the
    lock."""
    run_dir = lock_path.parent
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP or os.path.islink(lock_path):
                raise DihalValueError(
                    f"lock file {lock_path} is a symbolic link (to {os.readlink(lock_path)}); refusing to "
                    "follow it out of the run directory: remove the link"
                ) from None
            raise _os_refusal(exc)(f"run directory {run_dir} is not writable ({exc.strerror})") from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise DihalValueError(f"lock file {lock_path} is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                holder = _read_holder(fd)
                os.close(fd)
                raise _busy(run_dir, holder) from None
            if exc.errno not in _NO_LOCKS:
                os.close(fd)
                raise
            _check_recorded_holder(fd, lock_path)
            break
        if _is_current(fd, lock_path):
            break
        os.close(fd)  # the holder removed the file between our open and our lock: lock the new one
    stale = _read_holder(fd)
    if stale:
        _wait_for_writers(fd, stale, run_dir)
        logger.warning("taking over the lock of %s left in %s: that process is gone", _describe(stale), run_dir)
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "argv": sys.argv,
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    return fd


def refuse_busy(path: str | os.PathLike) -> None:
    """Refuse ``path`` now when a live process holds its lock: the check :func:`run_directory` makes, early and
    without taking the lock, so that a second writer stops before its heavy imports (torch, transformers: seconds,
    tens of seconds on a loaded node). Anything this cannot tell (no lock file, no file locks on the filesystem,
    another rank) is left to :func:`run_directory`."""
    if launcher_env().rank != 0:
        return
    lock_path = Path(path) / LOCK_NAME
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        holder = _read_holder(fd)
        if holder.get("host") == socket.gethostname() and not _pid_alive(holder.get("pid")):
            return  # left by a killed process: run_directory takes it over
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise _busy(lock_path.parent, holder) from None
    finally:
        os.close(fd)


def _busy(run_dir: Path, holder: dict) -> RunDirectoryBusy:
    return RunDirectoryBusy(
        f"run directory {run_dir} is in use by {_describe(holder)}; wait for it to finish or choose another --out"
    )


def _wait_for_writers(fd: int, holder: dict, run_dir: Path) -> None:
    """Wait (at most :data:`WRITERS_GRACE_S`) for the recorded helper processes of a gone holder to end; refuse
    the directory while one still runs."""
    writers = holder.get("writers") if holder.get("host") == socket.gethostname() else None
    if not isinstance(writers, list):
        return
    deadline = time.monotonic() + WRITERS_GRACE_S
    while alive := [pid for pid in writers if _pid_alive(pid)]:
        if time.monotonic() > deadline:
            os.close(fd)
            raise RunDirectoryBusy(
                f"run directory {run_dir} is still written by pid(s) {alive}, helper processes of the gone "
                f"{_describe(holder)}; wait for them to end or stop them"
            )
        time.sleep(0.1)


def register_writers(path: str | os.PathLike, pids: Iterable[int]) -> None:
    """Record ``pids`` (helper processes writing into ``path``, held by this process) in its lock file, so that a
    later run does not take the directory while one of them lives (see :func:`die_with_parent`)."""
    fd = _HELD[os.path.abspath(path)]
    record = {**_read_holder(fd), "writers": sorted(set(pids))}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)


def die_with_parent(parent_pid: int) -> None:
    """In a helper process: be killed (SIGKILL) when the parent ends, however it ends (Linux ``prctl``
    ``PR_SET_PDEATHSIG``); exit at once when the parent is already gone. Elsewhere only the second part."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG = 1
            logger.warning("prctl(PR_SET_PDEATHSIG) failed (errno %d)", ctypes.get_errno())
    if os.getppid() != parent_pid:
        os._exit(1)


def _check_recorded_holder(fd: int, lock_path: Path) -> None:
    """Without kernel locks: refuse when the recorded holder may still run (alive here, or on another host)."""
    holder = _read_holder(fd)
    logger.warning(
        "the filesystem of %s does not support file locks; only the holder recorded there is checked", lock_path.parent
    )
    if holder and (holder.get("host") != socket.gethostname() or _pid_alive(holder.get("pid"))):
        os.close(fd)
        raise RunDirectoryBusy(
            f"run directory {lock_path.parent} is in use by {_describe(holder)} (this filesystem "
            f"has no file locks: if that process is gone, delete {lock_path})"
        )


def _is_current(fd: int, lock_path: Path) -> bool:
    """Whether ``fd`` is still the file at ``lock_path`` (a releasing holder unlinks it before unlocking)."""
    try:
        on_disk = os.lstat(lock_path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _read_holder(fd: int) -> dict:
    """The holder recorded in the lock file (empty when none or unreadable)."""
    try:
        text = os.pread(fd, 65536, 0).decode()
        holder = json.loads(text) if text.strip() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict) -> str:
    if not holder:
        return "another process (it has not recorded itself yet)"
    return (
        f"pid {holder.get('pid')} on host {holder.get('host')} ({holder.get('command')}, "
        f"started {holder.get('started')})"
    )


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True
