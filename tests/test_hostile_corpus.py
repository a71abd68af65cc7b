"""Corpus reading is bounded by the blocks asked for, not by the length of a line (issue 21), and gives the
tokens it gave before on ordinary corpora."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dihal_fast.common.assets import default_corpus, default_model_dir
from dihal_fast.corpus import read_texts
from dihal_fast.corpus.blocks import PIECE_CHARS, document_pieces, iter_token_blocks


def whole_document_blocks(tokenizer, texts, seq_len: int) -> list[list[int]]:
    """The reader before issue 21: every document tokenized whole, then joined by EOS and cut."""
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
from transformers import AutoTokenizer
from dihal_fast.common.assets import default_model_dir
from dihal_fast.corpus import read_texts
from dihal_fast.corpus.blocks import iter_token_blocks
tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
blocks = list(iter_token_blocks(tokenizer, read_texts(sys.argv[1]), 128, max_tokens=2048))
print(len(blocks), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


@pytest.mark.slow  # tokenizes a 5 MB corpus in a fresh interpreter
def test_a_one_line_corpus_is_read_in_bounded_memory(tmp_path, shipped):
    """5 MB in one line with --max-tokens 2048: 1.55 GB before; now the tokenizer sees 64k characters at a time."""
    corpus = tmp_path / "one_line.txt"
    corpus.write_text(" ".join(shipped[1]) * 12)
    assert corpus.stat().st_size > 5_000_000
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(corpus)], capture_output=True, text=True, check=True
    ).stdout
    n_blocks, grown_mb = map(int, out.split())
    assert n_blocks == 16
    assert grown_mb < 300, f"reading grew the process by {grown_mb} MB"
