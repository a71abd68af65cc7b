"""One place every command's output goes through: usable-path checks and one writer per run directory.

``with run_directory(out, "dihal replace"):`` refuses an ``out`` that is a file (a one-line
``ValueError``), creates the directory and holds ``out/.dihal-run.lock`` for the whole block: an
exclusive ``flock`` on an open file, which the kernel drops however the process ends, plus the
holder's pid, host, command and start time written in the file. A second writer stops at once with
:class:`RunDirectoryBusy` naming the holder; a lock file left by a killed process is taken over with
a warning. On a filesystem without ``flock`` (Lustre ``noflock``, some FUSE mounts) the recorded
holder is still checked: a live process on this host, or any process on another host, keeps it.

Only global rank 0 (``RANK`` unset or 0, as torchrun and DeepSpeed set it) takes the lock: the other
processes of the same job write into the same directory under its protection.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from dihal_fast.common.io import check_directory_target, check_file_target, run_root
from dihal_fast.common.launch import launcher_env
from dihal_fast.errors import DihalValueError

logger = logging.getLogger(__name__)

LOCK_NAME = ".dihal-run.lock"
# flock errors meaning "this filesystem has no file locks", not "someone holds it".
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class RunDirectoryBusy(DihalValueError):
    """Another process holds the run directory (the CLI prints it as one line, exit 2)."""


def _nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest existing parent."""
    return next(p for p in (path, *path.absolute().parents) if p.exists())


def check_run_directory(path: str | os.PathLike) -> Path:
    """``path`` as a :class:`Path`, or a one-line ``ValueError`` when it or a parent is an existing file."""
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
    path: str | os.PathLike, command: str, files: tuple[str, ...] = (), folders: tuple[str, ...] = ()
) -> Iterator[Path]:
    """Check and create the run directory ``path`` and hold its lock (rank 0) while the block runs.

    ``command`` (e.g. ``"dihal replace"``) is recorded so that a refused second writer can say who
    holds the directory. ``files`` and ``folders`` are the outputs the command will write (relative
    to ``path``): one of the wrong kind, or a symbolic link, is refused now, before any work. While the
    block runs no file below ``path`` is written through a link (see :mod:`dihal_fast.common.io`).
    Raises ``ValueError`` (``RunDirectoryBusy`` when it is held).
    """
    path = check_run_directory(path)
    check_outputs(path, files, folders)
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DihalValueError(f"run directory {path} cannot be created ({exc.strerror})") from None
    if launcher_env().rank != 0:  # RANK, or SLURM_PROCID under srun without torchrun
        with run_root(path):
            yield path
        return
    lock_path = path / LOCK_NAME
    fd = _acquire(lock_path, command)
    try:
        with run_root(path):
            yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path)  # while still holding the lock: see _acquire's inode check
        os.close(fd)
        if created:  # a command refused before writing anything leaves no empty directory behind
            with contextlib.suppress(OSError):
                path.rmdir()


def check_outputs(run_dir: Path, files: tuple[str, ...], folders: tuple[str, ...]) -> None:
    """A ``ValueError`` now when an output of the command is a link or of the wrong kind (a folder where a file
    goes)."""
    for name in files:
        check_file_target(run_dir / name)
    for name in folders:
        check_directory_target(run_dir / name)


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
            raise DihalValueError(f"run directory {run_dir} is not writable ({exc.strerror})") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise DihalValueError(f"lock file {lock_path} is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                holder = _read_holder(fd)
                os.close(fd)
                raise RunDirectoryBusy(
                    f"run directory {run_dir} is in use by {_describe(holder)}; wait for it to "
                    "finish or choose another --out"
                ) from None
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
