"""The one writer of run-directory files: atomic, never through a symbolic link, with ``open()``'s permissions.

Every file a command writes goes through :func:`atomic_write_bytes` (or :func:`atomic_write_json`), and
every folder written as a whole (a checkpoint, an exported model) through :func:`atomic_directory`:

- complete or absent: the data goes to a temporary file (folder) beside the target, then is renamed;
  on any failure (a full disk included) the temporary is removed and the error names the target;
- never through a symbolic link: a target that is a link, or a link between an open run directory
  (:func:`run_root`) and the target, is refused up front with a ``ValueError``, so a run never writes
  outside its directory (commands run as root on shared clusters);
- a target of the wrong kind (a directory where a file goes, a file where a directory goes) is a
  ``ValueError`` before anything is written: :func:`check_file_target`, :func:`check_directory_target`;
- permissions are those a plain ``open()`` / ``mkdir()`` gives (``0666`` / ``0777`` less the umask),
  not ``mkstemp``'s ``0600``: colleagues on shared storage can read a run.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from dihal_fast.errors import DihalTypeError, DihalValueError

logger = logging.getLogger(__name__)

# Run directories open in this process (their lock held): below them no path component may be a link.
_RUN_ROOTS: list[str] = []


@contextlib.contextmanager
def run_root(path: str | os.PathLike) -> Iterator[None]:
    """While the block runs, refuse symbolic links anywhere between ``path`` and a file written below it."""
    _RUN_ROOTS.append(os.path.abspath(path))
    try:
        yield
    finally:
        _RUN_ROOTS.remove(os.path.abspath(path))


def _links_below_root(path: Path, itself: bool) -> Path | None:
    """The first existing symbolic link between an open run root and ``path`` (``path`` included when ``itself``)."""
    target = os.path.abspath(path)
    if itself and os.path.islink(target):
        return Path(target)
    for root in _RUN_ROOTS:
        if os.path.commonpath([root, target]) != root:
            continue
        current = root
        for part in Path(os.path.relpath(target, root)).parts:
            current = os.path.join(current, part)
            if os.path.islink(current):
                return Path(current)
    return None


def _refuse_links(path: Path, itself: bool = True) -> None:
    link = _links_below_root(path, itself)
    if link is not None:
        raise DihalValueError(
            f"{link} is a symbolic link (to {os.readlink(link)}); refusing to write {path} through it, "
            "outside the run directory: remove the link"
        )


def check_file_target(path: str | os.PathLike) -> Path:
    """``path`` as a :class:`Path` when a file can be written there: not a link, not a directory, no file above it."""
    path = Path(path)
    _refuse_links(path)
    if path.is_dir():
        raise DihalValueError(
            f"{path} is a directory, where this command writes a file; move it away or choose another --out"
        )
    _check_parents(path)
    return path


def check_directory_target(path: str | os.PathLike, itself: bool = True) -> Path:
    """``path`` as a :class:`Path` when a folder can be written there: not a file, no file above it, not a link
    (unless ``itself`` is false: a folder that only receives files may be a link the user made, outside runs)."""
    path = Path(path)
    _refuse_links(path, itself)
    if path.exists() and not path.is_dir():
        raise DihalValueError(
            f"{path} is a file, where this command writes a folder; move it away or choose another --out"
        )
    _check_parents(path)
    return path


def _check_parents(path: Path) -> None:
    for parent in Path(os.path.abspath(path)).parents:
        if parent.exists():
            if not parent.is_dir():
                raise DihalValueError(f"cannot write {path}: {parent} is a file, not a directory")
            return


def make_directories(path: str | os.PathLike) -> Path:
    """``mkdir -p`` with ``mkdir``'s permissions, refusing links below an open run root and files on the way."""
    path = check_directory_target(path, itself=False)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _naming(exc, path) from None
    return path


def _naming(exc: OSError, path: Path) -> OSError:
    """The same kind of error, naming the file asked for instead of a temporary one."""
    return type(exc)(exc.errno, f"cannot write {path}: {exc.strerror or exc}")


def _open_new(opened: Path, flags: int, target: Path) -> int:
    """``os.open`` of ``opened`` for writing ``target`` (never through a link, ``open()``'s mode), creating its
    folders."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return os.open(opened, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | flags, 0o666)
    except OSError as exc:
        raise _naming(exc, target) from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory and rename it (see the module doc)."""
    path = check_file_target(path)  # also refuses links on the way from an open run root
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}"
    fd = _open_new(tmp, os.O_EXCL, path)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _naming(exc, path) from None
        raise
    return path


def _json_default(obj: Any) -> Any:
    """Other mappings (a :class:`~dihal_fast.common.reports.StageReport`) as the dicts they read like."""
    if isinstance(obj, Mapping):
        return dict(obj)
    raise DihalTypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON, atomically; any ``Mapping`` in it is written as a JSON object."""
    return atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n").encode())


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line to a log (``O_APPEND``, never through a link); a crash can at most cut the last line."""
    path = check_file_target(path)
    fd = _open_new(path, os.O_APPEND, path)
    try:
        _write_all(fd, (line.rstrip("\n") + "\n").encode())
    except OSError as exc:
        raise _naming(exc, path) from None
    finally:
        os.close(fd)


def temporary_directory(path: str | os.PathLike) -> Path:
    """The fresh hidden folder ``.tmp_<name>`` beside ``path`` (an earlier one, left by a crash, is removed first)."""
    path = check_directory_target(path)
    tmp = path.parent / f".tmp_{path.name}"
    _remove(tmp)
    make_directories(path.parent)
    try:
        tmp.mkdir()
    except OSError as exc:
        raise _naming(exc, path) from None
    return tmp


def replace_directory(tmp: Path, path: str | os.PathLike) -> Path:
    """Move the complete folder ``tmp`` to ``path``, removing what was there (never following a link)."""
    path = check_directory_target(path)
    old = path.parent / f".old_{path.name}"
    _remove(old)
    try:
        if path.exists():
            path.rename(old)
        tmp.rename(path)
    except OSError as exc:
        raise _naming(exc, path) from None
    _remove(old)
    return path


def _remove(path: Path) -> None:
    """Delete a file, link (not its target) or folder tree if present."""
    if os.path.islink(path) or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary folder to fill; on success it replaces ``path`` whole, on failure it is removed."""
    tmp = temporary_directory(path)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_directory(tmp, path)


def write_into(directory: str | os.PathLike, write: Callable[[Path], object]) -> None:
    """Let ``write(folder)`` (e.g. transformers' ``save_pretrained``, which opens its files itself) fill a fresh
    hidden folder, then move each file it wrote into ``directory`` atomically, refusing links and paths of the
    wrong kind there first; the other files of ``directory`` stay."""
    directory = make_directories(directory)
    tmp = temporary_directory(directory / ".files")
    try:
        write(tmp)
        written = sorted(p for p in tmp.rglob("*") if p.is_file())
        targets = [check_file_target(directory / path.relative_to(tmp)) for path in written]
        for path, target in zip(written, targets):
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporary files that :func:`atomic_write_bytes` to ``path`` left behind when its
    process was killed mid-write; returns them. Only safe while holding the run directory's lock."""
    path = Path(path)
    stale = sorted(path.parent.glob(f".{glob.escape(path.name)}.*")) if path.parent.is_dir() else []
    for temporary in stale:
        _remove(temporary)
        logger.info("removed %s, left by an interrupted write", temporary)
    return stale


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    """Read JSON with an error that names the file and says what it should have been."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DihalValueError(f"{what} {path} is not valid JSON ({exc}); it may be corrupt or half-written") from None
