"""Documents from local corpora: ``.txt`` (blank-line separated paragraphs), ``.jsonl`` (a ``text``
field per line), directories of those, or a dataset saved with ``datasets.save_to_disk``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from dihal_fast.errors import DihalValueError

TEXT_SUFFIXES = (".txt", ".text", ".md")
JSONL_SUFFIXES = (".jsonl", ".json")


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
        found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES + JSONL_SUFFIXES)
        if not found:
            raise DihalValueError(f"corpus directory {path} holds no .txt or .jsonl files and is not a saved dataset")
        out.extend(found)
    if not out:
        raise DihalValueError("no corpus paths given")
    return out


def _decode(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DihalValueError(
            f"{path} is not UTF-8: invalid byte 0x{data[exc.start]:02x} at offset {exc.start}"
        ) from None


def _paragraphs(text: str) -> Iterator[str]:
    block: list[str] = []
    for line in text.splitlines():
        if line.strip():
            block.append(line)
        elif block:
            yield "\n".join(block)
            block = []
    if block:
        yield "\n".join(block)


def _jsonl_texts(path: Path) -> Iterator[str]:
    for number, line in enumerate(_decode(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DihalValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise DihalValueError(f"{path}:{number}: expected an object with a string 'text' field")
        if record["text"].strip():
            yield record["text"]


def _dataset_texts(path: Path) -> Iterator[str]:
    try:
        import datasets
    except ImportError:
        raise DihalValueError(
            f"{path} is a saved Hugging Face dataset; install the optional dependency: pip install datasets"
        ) from None
    loaded = datasets.load_from_disk(str(path))
    splits = list(loaded.values()) if isinstance(loaded, datasets.DatasetDict) else [loaded]
    for split in splits:
        if "text" not in split.column_names:
            raise DihalValueError(f"dataset {path} has no 'text' column (columns: {split.column_names})")
        for text in split["text"]:
            if isinstance(text, str) and text.strip():
                yield text


def read_texts(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> Iterator[str]:
    """Yield the documents of a corpus in a fixed order. Raises if it holds no text at all."""
    empty = True
    for path in corpus_files(paths):
        if _is_saved_dataset(path):
            texts: Iterable[str] = _dataset_texts(path)
        elif path.suffix in JSONL_SUFFIXES:
            texts = _jsonl_texts(path)
        else:
            texts = _paragraphs(_decode(path))
        for text in texts:
            empty = False
            yield text
    if empty:
        raise DihalValueError(f"corpus {[str(p) for p in corpus_files(paths)]} contains no text")
