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
  not ``mkstemp``'s ``0600``: colleagues on shared storage can read a run. Files another library writes
  itself (safetensors creates ``0600`` files) are given the same mode (:func:`follow_umask`) before they
  are renamed into place;
- a failed write (no space, no permission, a vanished folder, and the forms torch and safetensors give
  those: :func:`writing`) is a :class:`~dihal_fast.errors.DihalIOError` naming the target.

Test hook: with ``DIHAL_TEST_KILL_AT=write:N`` in the environment the process kills itself (``SIGKILL``)
just before its N-th file write, and with ``DIHAL_TEST_KILL_AT=NAME`` (or ``NAME:N``) at the N-th pass of
the named point ``NAME`` (:func:`kill_point`): the resume tests kill runs at chosen moments this way.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import re
import secrets
import shutil
import signal
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from dihal_fast.errors import DihalIOError, DihalTypeError, DihalValueError

logger = logging.getLogger(__name__)

# Run directories open in this process (their lock held): below them no path component may be a link.
_RUN_ROOTS: list[str] = []
# The run marker (see dihal_fast.common.rundir) lists the entries a run wrote at the top of its directory.
MARKER_NAME = ".dihal-run.json"
# Roots whose marker this process keeps, and the entries it lists.
_RECORDED: dict[str, set[str]] = {}


@contextlib.contextmanager
def run_root(path: str | os.PathLike, record: bool = False) -> Iterator[None]:
    """While the block runs, refuse symbolic links anywhere between ``path`` and a file written below it; with
    ``record``, list each top-level entry written below ``path`` in its marker before writing it (so that
    ``--overwrite`` clears exactly the run's own files, even after a kill)."""
    root = os.path.abspath(path)
    _RUN_ROOTS.append(root)
    if record:
        _RECORDED[root] = set(_marker(Path(root)).get("written", []))
    try:
        yield
    finally:
        _RUN_ROOTS.remove(root)
        if record and root not in _RUN_ROOTS:
            _RECORDED.pop(root, None)


def _marker(root: Path) -> dict:
    """The run marker of ``root`` (empty when none or unreadable)."""
    try:
        marker = json.loads((root / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def record_entry(path: Path) -> None:
    """Before ``path`` is written: list its top-level entry in the marker of the innermost recording run root."""
    target = os.path.abspath(path)
    roots = [r for r in _RECORDED if r != target and os.path.commonpath([r, target]) == r]
    if not roots:
        return
    root = max(roots, key=len)
    name = Path(os.path.relpath(target, root)).parts[0]
    if name in _RECORDED[root] or name.startswith(".dihal-run"):
        return
    _RECORDED[root].add(name)
    marker = _marker(Path(root))
    marker["written"] = sorted(set(marker.get("written", [])) | {name})
    atomic_write_json(Path(root) / MARKER_NAME, marker)


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
    record_entry(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _naming(exc, path) from None
    return path


def _naming(exc: OSError, path: Path) -> DihalIOError:
    """A :class:`DihalIOError` with the same ``errno``, naming the file asked for instead of a temporary one."""
    return DihalIOError(exc.errno, f"cannot write {path}: {exc.strerror or exc}")


# How torch's and safetensors' writers report a failed write (a full disk, a vanished folder) without an OSError.
_WRITE_FAILURES = re.compile(
    r"basic_ios::clear|unexpected pos|inline_container\.cc|file write failed|No space left|"
    r"Permission denied|No such file or directory|Read-only file system|I/O error|Disk quota",
    re.IGNORECASE,
)


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Run a third-party writer of ``path`` (``torch.save``, ``safetensors``' ``save_file``, ``save_pretrained``):
    any failed write it reports (an ``OSError``, or torch's ``RuntimeError`` / safetensors' ``SafetensorError``
    whose message says the write failed) becomes one :class:`DihalIOError` naming ``path``; other errors pass."""
    try:
        yield
    except DihalIOError:
        raise
    except OSError as exc:
        raise _naming(exc, Path(path)) from None
    except Exception as exc:  # noqa: BLE001  (torch and safetensors raise RuntimeError / SafetensorError)
        text = " ".join(str(exc).split())
        if not _WRITE_FAILURES.search(text):
            raise
        raise DihalIOError(
            None, f"cannot write {path}: {text[:300]} (the disk may be full, or the folder not writable)"
        ) from None


def _umask() -> int:
    """This process's umask (read from ``/proc``, or by setting it and setting it straight back)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    current = os.umask(0o022)
    os.umask(current)
    return current


def follow_umask(tree: str | os.PathLike) -> None:
    """Give ``tree`` (a file, or every file below a folder) the mode ``open()`` would have given it: for what
    another library wrote with its own mode (safetensors writes ``0600``). Executable bits are kept."""
    tree, mask = Path(tree), _umask()
    files = [tree] if tree.is_file() else [p for p in tree.rglob("*") if p.is_file() and not p.is_symlink()]
    for path in files:
        os.chmod(path, (0o666 | (os.lstat(path).st_mode & 0o111)) & ~mask)


_KILL_COUNTS: dict[str, int] = {}


def kill_point(name: str) -> None:
    """Test hook (see the module doc): ``SIGKILL`` this process at the N-th pass of point ``name`` when
    ``DIHAL_TEST_KILL_AT`` is ``name`` (N = 1) or ``name:N``; costs one environment lookup otherwise."""
    wanted = os.environ.get("DIHAL_TEST_KILL_AT")
    if not wanted:
        return
    point, _, count = wanted.partition(":")
    if point != name:
        return
    _KILL_COUNTS[name] = _KILL_COUNTS.get(name, 0) + 1
    if _KILL_COUNTS[name] == int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)


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
    kill_point("write")
    record_entry(path)
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
    record_entry(path)
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
    record_entry(path)
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
    follow_umask(tmp)
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
        with writing(directory):
            write(tmp)
        follow_umask(tmp)
        written = sorted(p for p in tmp.rglob("*") if p.is_file())
        targets = [check_file_target(directory / path.relative_to(tmp)) for path in written]
        for path, target in zip(written, targets):
            record_entry(target)
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
    from dihal_fast.common.json_input import parse_json

    return parse_json(path.read_bytes(), f"{what} {path}", "; it may be corrupt or half-written")
