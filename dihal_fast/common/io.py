"""Atomic file output: a report or checkpoint is either complete or absent, never half-written."""
from __future__ import annotations

import glob
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory and rename it."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:  # name the file asked for, not the temporary one
        raise type(exc)(exc.errno, f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporary files that :func:`atomic_write_bytes` to ``path`` left behind when its
    process was killed mid-write; returns them. Only safe while holding the run directory's lock."""
    path = Path(path)
    stale = sorted(path.parent.glob(f".{glob.escape(path.name)}.*")) if path.parent.is_dir() else []
    for temporary in stale:
        temporary.unlink(missing_ok=True)
        logger.info("removed %s, left by an interrupted write", temporary)
    return stale


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON, atomically."""
    return atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    """Read JSON with an error that names the file and says what it should have been."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} {path} is not valid JSON ({exc}); it may be corrupt or half-written") from None
