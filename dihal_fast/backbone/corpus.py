"""Reading and checking plain-text corpus files (UTF-8), and splitting off a held-out tail."""

from __future__ import annotations

import hashlib
from pathlib import Path

from dihal_fast.errors import DihalValueError


def read_text_file(path: str | Path) -> str:
    """Return the text of a UTF-8 corpus file; a missing, empty or non-UTF-8 file is a clear error."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"corpus file not found: {path}")
    if not path.is_file():
        raise DihalValueError(f"corpus path {path} is not a regular file (expected a UTF-8 text file)")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 4].hex(" ")
        raise DihalValueError(
            f"corpus file {path} is not valid UTF-8: byte offset {exc.start} (bytes {bad}); "
            "convert it to UTF-8 first, e.g. iconv -f latin1 -t utf-8"
        ) from None
    if not text.strip():
        raise DihalValueError(f"corpus file {path} is empty (expected UTF-8 text with at least one non-blank line)")
    return text


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes (recorded in reports so the training data is identifiable)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def split_tail(text: str, fraction: float) -> tuple[str, str]:
    """Split ``text`` into (head, tail) with about ``fraction`` of the characters in the tail, cut at a line break."""
    if not 0.0 < fraction < 1.0:
        raise DihalValueError(f"valid fraction must be in (0, 1), got {fraction}")
    cut = int(len(text) * (1.0 - fraction))
    newline = text.find("\n", cut)
    cut = newline + 1 if 0 <= newline < len(text) - 1 else cut
    head, tail = text[:cut], text[cut:]
    if not head.strip() or not tail.strip():
        raise DihalValueError(
            f"text of {len(text)} characters is too short to hold out a {fraction:.0%} validation tail"
        )
    return head, tail


def default_valid_files(corpus: list[Path]) -> list[Path] | None:
    """The ``X.valid.txt`` next to every ``X.train.txt`` in ``corpus``, or None unless all of them exist."""
    found = []
    for path in corpus:
        name = Path(path).name
        if not name.endswith(".train.txt"):
            return None
        valid = Path(path).with_name(name[: -len(".train.txt")] + ".valid.txt")
        if not valid.is_file():
            return None
        found.append(valid)
    return found
