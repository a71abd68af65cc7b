"""Corpus reading is bounded by the blocks asked for, not by the size of a file or the length of a line, and
gives the documents and tokens the whole-file reader gave on ordinary corpora; odd paths and records are one
line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dihal_fast.common.assets import default_corpus, default_model_dir
from dihal_fast.corpus import read_texts
from dihal_fast.corpus.blocks import PIECE_CHARS, document_pieces, iter_token_blocks
from dihal_fast.errors import DihalError


def whole_document_blocks(tokenizer, texts, seq_len: int) -> list[list[int]]:
    """Every document tokenized whole, then joined by EOS and cut (what the pieces must reproduce)."""
    eos, buffer, out = tokenizer.eos_token_id, [], []
    for text in texts:
        buffer.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            buffer.append(eos)
        while len(buffer) >= seq_len:
            out.append(buffer[:seq_len])
            buffer = buffer[seq_len:]
    return out


@pytest.fixture(scope="module")
def shipped():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir()), list(read_texts(default_corpus()))


def test_the_shipped_corpus_gives_the_same_blocks_as_before(shipped):
    tokenizer, texts = shipped
    assert [b.tolist() for b in iter_token_blocks(tokenizer, texts, 128)] == whole_document_blocks(
        tokenizer, texts, 128
    )


@pytest.mark.parametrize("family", ["shipped", "gpt2", "qwen3", "llama", "mistral"])
def test_a_long_line_is_tokenized_in_pieces_into_the_same_blocks(shipped, tiny_checkpoints, family):
    from transformers import AutoTokenizer

    tokenizer = shipped[0] if family == "shipped" else AutoTokenizer.from_pretrained(tiny_checkpoints[family])
    line = "  ".join(shipped[1])[: 3 * PIECE_CHARS + 123]  # one document of four pieces, double spaces included
    assert len(list(document_pieces(line))) == 4
    assert [b.tolist() for b in iter_token_blocks(tokenizer, [line], 64)] == whole_document_blocks(
        tokenizer, [line], 64
    )


@pytest.mark.parametrize(
    "text", ["", "a", "x" * (PIECE_CHARS * 2 + 5), ("word " * PIECE_CHARS), " " * (PIECE_CHARS + 3)]
)
def test_pieces_join_back_into_the_document(text):
    pieces = list(document_pieces(text))
    assert "".join(pieces) == text and all(len(p) <= PIECE_CHARS for p in pieces)


MEASURE = """
import resource, sys
from dihal_fast.corpus import read_texts
from dihal_fast.corpus.blocks import iter_token_blocks
class WordTokenizer:  # the reader's memory is measured, not a tokenizer's
    eos_token_id = 0
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [len(word) for word in text.split()]}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
blocks = list(iter_token_blocks(WordTokenizer(), read_texts(sys.argv[1]), 128, max_tokens=2048))
print(len(blocks), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""
BIG = 60_000_000  # bytes: the whole-file reader grew the process by 114 MB on either shape, the chunked one by 3


def _big_corpus(tmp_path, shape: str, text: str):
    """A corpus file of about :data:`BIG` bytes: one line of text, or JSONL records of 2,000 characters."""
    if shape == "one_line":
        path, unit = tmp_path / "one_line.txt", " ".join(text.split())
    else:
        path, unit = tmp_path / "records.jsonl", json.dumps({"text": text[:2000]}) + "\n"
    path.write_text(unit * (BIG // len(unit) + 1))
    return path


@pytest.mark.parametrize("shape", ["one_line", "jsonl"])
def test_a_corpus_file_larger_than_the_bound_is_read_in_bounded_memory(tmp_path, shape):
    """--max-tokens 2048 from a 60 MB file: the reader stops after the first chunks, whatever the shape."""
    corpus = _big_corpus(tmp_path, shape, default_corpus().read_text())
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(corpus)], capture_output=True, text=True, check=True
    ).stdout
    n_blocks, grown_mb = map(int, out.split())
    assert n_blocks == 16
    assert grown_mb < 40, f"reading 2,048 tokens of a {BIG // 10**6} MB file grew the process by {grown_mb} MB"


def _whole_file_documents(path) -> list[str]:
    """The documents as the whole-file reader gave them: paragraphs of str.splitlines, or JSONL texts."""
    lines = path.read_bytes().decode("utf-8").splitlines()
    if path.suffix == ".jsonl":
        return [t for t in (json.loads(line)["text"] for line in lines if line.strip()) if t.strip()]
    documents, block = [], []
    for line in [*lines, ""]:
        if line.strip():
            block.append(line)
        elif block:
            documents.append("\n".join(block))
            block = []
    return documents


ODD = ["a", "b", " ", "  ", "\n", "\r\n", "\r", "\u2028", "\x0c", "é", "日本", "\t", "\n\n", " \n"]


@pytest.mark.parametrize("chunk", [1, 2, 3, 64])
def test_chunked_reading_gives_the_documents_of_the_whole_file(tmp_path, monkeypatch, chunk):
    """Line ends split across chunks (\\r | \\n), UTF-8 characters split across chunks, blank lines of spaces."""
    import random

    from dihal_fast.corpus import reader

    monkeypatch.setattr(reader, "CHUNK_BYTES", chunk)
    rng = random.Random(chunk)
    for _ in range(60):
        text = "".join(rng.choice(ODD) for _ in range(rng.randint(0, 120)))
        plain = tmp_path / "plain.txt"
        plain.write_bytes(text.encode())
        records = tmp_path / "records.jsonl"
        records.write_text("".join(json.dumps({"text": t}) + rng.choice(["\n", "\r\n"]) for t in text.split("a")))
        for path in (plain, records):
            assert _documents(path) == _whole_file_documents(path), (path.name, text)


def _documents(path) -> list[str]:
    """The reader's documents of ``path``; none when it refuses the file as holding no text."""
    try:
        return list(read_texts(path))
    except DihalError as exc:
        assert "contains no text" in str(exc)
        return []


def test_a_bad_byte_is_named_by_its_offset_in_the_file(tmp_path, monkeypatch):
    from dihal_fast.corpus import reader

    monkeypatch.setattr(reader, "CHUNK_BYTES", 3)
    path = tmp_path / "latin1.txt"
    path.write_bytes("héllo wörld".encode() + b" \xff tail")
    with pytest.raises(ValueError, match=r"invalid byte 0xff at offset 14"):
        list(read_texts(path))


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_fifo_or_device_is_not_called_a_corpus_directory(tmp_path, kind):
    import os

    if kind == "fifo":
        path = tmp_path / "pipe"
        os.mkfifo(path)
    else:
        path = kind
    with pytest.raises(DihalError, match="is a (FIFO|character device), not a file or a directory"):
        list(read_texts(path))


def test_a_deeply_nested_jsonl_record_is_one_line(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text('{"text": "ok"}\n{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(DihalError, match="deep.jsonl:2 is not valid JSON [(]nested deeper than 100 levels"):
        list(read_texts(path))
