"""Documents from local corpora: ``.txt`` (blank-line separated paragraphs), ``.jsonl`` (a ``text``
field per line), directories of those, or a dataset saved with ``datasets.save_to_disk``.

Files are read in chunks of :data:`CHUNK_BYTES` and documents handed on in pieces
(:mod:`dihal_fast.corpus.pieces`), so memory does not follow the file: a reader that has what it wanted
(``--max-tokens``) stops reading. A JSONL record is parsed whole, so there memory follows the longest line.
"""

from __future__ import annotations

import codecs
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from dihal_fast.common.json_input import parse_json
from dihal_fast.corpus.pieces import END, PieceCutter
from dihal_fast.errors import DihalValueError

TEXT_SUFFIXES = (".txt", ".text", ".md")
JSONL_SUFFIXES = (".jsonl", ".json")
CHUNK_BYTES = 1 << 20


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file())


def corpus_files(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """The files (or saved-dataset directories) a corpus argument names, checked to exist."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise FileNotFoundError(f"corpus path does not exist: {path}")
        if path.is_file() or _is_saved_dataset(path):
            out.append(path)
            continue
        if not path.is_dir():
            raise DihalValueError(
                f"corpus path {path} is a {_kind(path)}, not a file or a directory of .txt / .jsonl files"
            )
        found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES + JSONL_SUFFIXES)
        if not found:
            raise DihalValueError(f"corpus directory {path} holds no .txt or .jsonl files and is not a saved dataset")
        out.extend(found)
    if not out:
        raise DihalValueError("no corpus paths given")
    return out


def _kind(path: Path) -> str:
    mode = path.stat().st_mode
    kinds = {stat.S_ISFIFO: "FIFO", stat.S_ISCHR: "character device", stat.S_ISBLK: "block device"}
    return next((name for test, name in kinds.items() if test(mode)), "socket or special file")


def _chunks(path: Path) -> Iterator[str]:
    """The UTF-8 text of ``path`` in chunks of about :data:`CHUNK_BYTES`; a byte that is not UTF-8 is one
    error naming its offset in the file."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0  # bytes of the file handed to the decoder so far
    with open(path, "rb") as handle:
        while True:
            data = handle.read(CHUNK_BYTES)
            pending = len(decoder.getstate()[0])
            try:
                text = decoder.decode(data, final=not data)
            except UnicodeDecodeError as exc:
                where = offset - pending + exc.start
                raise DihalValueError(
                    f"{path} is not UTF-8: invalid byte 0x{exc.object[exc.start]:02x} at offset {where}"
                ) from exc
            offset += len(data)
            if text:
                yield text
            if not data:
                return


def _lines(chunks: Iterable[str]) -> Iterator[tuple[str, bool]]:
    """``(part, ends_line)`` for the text of ``chunks``, split where :meth:`str.splitlines` splits: a line
    comes as one or more parts (a long line across chunks), the last with ``ends_line`` True; terminators are
    dropped. A ``\\r`` at the end of a chunk waits for the next, which may begin with its ``\\n``."""
    held = ""
    for chunk in chunks:
        text, held = held + chunk, ""
        if text.endswith("\r"):
            text, held = text[:-1], "\r"
        for segment in text.splitlines(keepends=True):
            content = segment.splitlines()[0]
            yield content, len(content) < len(segment)
    if held:
        yield "", True


def _paragraph_pieces(path: Path) -> Iterator[str | None]:
    """The paragraphs of a text file (runs of non-blank lines joined by ``\\n``) as pieces, each followed by
    :data:`END`; a line's leading whitespace is held until the line proves non-blank."""
    cutter: PieceCutter | None = None  # the paragraph being read
    blank = ""  # the start of the current line while it is whitespace only
    line_started = False  # the current line has shown a non-space character
    for part, ends_line in _lines(_chunks(path)):
        if not line_started:
            blank += part
            if blank.strip():
                line_started, part, blank = True, blank, ""
                if cutter is None:
                    cutter = PieceCutter()
                else:
                    yield from cutter.feed("\n")
        if line_started:
            yield from cutter.feed(part)  # type: ignore[union-attr]
        if ends_line:
            if not line_started and cutter is not None:  # a blank line ends the paragraph
                yield from cutter.finish()
                yield END
                cutter = None
            line_started, blank = False, ""
    if cutter is not None:
        yield from cutter.finish()
        yield END


def _jsonl_pieces(path: Path) -> Iterator[str | None]:
    for number, line in enumerate(_joined_lines(_lines(_chunks(path))), start=1):
        if not line.strip():
            continue
        record = parse_json(line, f"{path}:{number}")
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise DihalValueError(f"{path}:{number}: expected an object with a string 'text' field")
        if record["text"].strip():
            yield from _whole(record["text"])


def _joined_lines(parts: Iterable[tuple[str, bool]]) -> Iterator[str]:
    """Whole lines from :func:`_lines` (a JSON record is parsed whole)."""
    line: list[str] = []
    for part, ends_line in parts:
        line.append(part)
        if ends_line:
            yield "".join(line)
            line = []
    if line:
        yield "".join(line)


def _whole(text: str) -> Iterator[str | None]:
    cutter = PieceCutter()
    yield from cutter.feed(text)
    yield from cutter.finish()
    yield END


def _dataset_pieces(path: Path) -> Iterator[str | None]:
    try:
        import datasets
    except ImportError as exc:
        raise DihalValueError(
            f"{path} is a saved Hugging Face dataset; install the optional dependency: pip install datasets"
        ) from exc
    loaded = datasets.load_from_disk(str(path))
    splits = list(loaded.values()) if isinstance(loaded, datasets.DatasetDict) else [loaded]
    for split in splits:
        if "text" not in split.column_names:
            raise DihalValueError(f"dataset {path} has no 'text' column (columns: {split.column_names})")
        for text in split["text"]:
            if isinstance(text, str) and text.strip():
                yield from _whole(text)


class Corpus:
    """The documents of a corpus in a fixed order. Iterating gives each document as one string;
    :meth:`pieces` gives them as pieces (what :func:`~dihal_fast.corpus.blocks.iter_token_blocks` reads, so
    that memory is bounded by a piece), :meth:`sources` file by file. Each refuses a corpus that holds no text at
    all."""

    def __init__(self, paths: str | os.PathLike | Iterable[str | os.PathLike]) -> None:
        self.paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)

    def files(self) -> list[Path]:
        """The files (or saved datasets) of the corpus in reading order (:func:`corpus_files`)."""
        return corpus_files(self.paths)

    def sources(self) -> Iterator[tuple[Path, Iterator[str | None]]]:
        """``(file, its pieces)`` for every file of :meth:`files` in order; a file's pieces are read only as far
        as they are consumed, and a corpus in which no file gave a piece is refused at the end."""
        files = self.files()
        found = False

        def seen(pieces: Iterator[str | None]) -> Iterator[str | None]:
            nonlocal found
            for piece in pieces:
                found = True
                yield piece

        for path in files:
            yield path, seen(_file_pieces(path))
        if not found:
            raise DihalValueError(f"corpus {[str(p) for p in files]} contains no text")

    def pieces(self) -> Iterator[str | None]:
        """Every document as pieces of at most ``PIECE_CHARS`` characters, each document's followed by ``END``."""
        for _, pieces in self.sources():
            yield from pieces

    def __iter__(self) -> Iterator[str]:
        document: list[str] = []
        for piece in self.pieces():
            if piece is END:
                yield "".join(document)
                document = []
            else:
                document.append(piece)


def _file_pieces(path: Path) -> Iterator[str | None]:
    """The pieces of one corpus file (or saved dataset), by its kind."""
    if _is_saved_dataset(path):
        return _dataset_pieces(path)
    if path.suffix in JSONL_SUFFIXES:
        return _jsonl_pieces(path)
    return _paragraph_pieces(path)


def read_texts(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> Corpus:
    """The documents of a corpus in a fixed order (a :class:`Corpus`: iterate it for whole documents)."""
    return Corpus(paths)
