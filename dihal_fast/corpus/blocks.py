"""Fixed-length token blocks from a stream of documents (documents joined by the EOS token)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from dihal_fast.errors import DihalValueError

# Documents longer than this many characters are tokenized piece by piece, so memory follows the piece and
# not the document (a 25 MB one-line corpus took 5.6 GB whole). Pieces end before a space that starts a word,
# a pre-tokenizer boundary of byte-level BPE: the tokens are the whole document's.
PIECE_CHARS = 1 << 16


def document_pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """``text`` cut into pieces of at most ``size`` characters, each ending before a space followed by a
    non-space character when the window has one (else at ``size``)."""
    start = 0
    while len(text) - start > size:
        end = start + size
        while end > start and not (text[end] == " " and not text[end + 1].isspace()):
            end = text.rfind(" ", start + 1, end)
        end = end if end > start else start + size
        yield text[start:end]
        start = end
    yield text[start:]


def iter_token_blocks(
    tokenizer,
    texts: Iterable[str],
    seq_len: int,
    max_tokens: int | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[torch.Tensor]:
    """Yield ``LongTensor[seq_len]`` blocks cut from the concatenated token stream.

    Every document is followed by ``eos_token_id`` (when the tokenizer has one); the remainder that
    does not fill a block is dropped. With ``world_size > 1`` the blocks are dealt round-robin and
    this call yields those of ``rank``. ``max_tokens`` bounds the tokens yielded to this rank; long
    documents are tokenized in pieces (:func:`document_pieces`), so memory is bounded by
    :data:`PIECE_CHARS` and the blocks, whatever the length of a line.
    """
    if seq_len < 2:
        raise DihalValueError(f"seq_len must be >= 2, got {seq_len}")
    if not 0 <= rank < world_size:
        raise DihalValueError(f"rank must satisfy 0 <= rank < world_size ({world_size}), got {rank}")
    eos = tokenizer.eos_token_id
    buffer: list[int] = []
    block_index, yielded = 0, 0
    for text in texts:
        for ids in _document_ids(tokenizer, text, eos):
            buffer.extend(ids)
            start = 0
            while len(buffer) - start >= seq_len:
                block, start = buffer[start : start + seq_len], start + seq_len
                mine = block_index % world_size == rank
                block_index += 1
                if not mine:
                    continue
                if max_tokens is not None and yielded + seq_len > max_tokens:
                    return
                yielded += seq_len
                yield torch.tensor(block, dtype=torch.long)
            del buffer[:start]


def _document_ids(tokenizer, text: str, eos: int | None) -> Iterator[list[int]]:
    """The token ids of one document, piece by piece, then its EOS."""
    for piece in document_pieces(text):
        yield tokenizer(piece, add_special_tokens=False)["input_ids"]
    if eos is not None:
        yield [eos]


def token_blocks(tokenizer, texts: Iterable[str], seq_len: int, max_tokens: int | None = None) -> torch.Tensor:
    """All blocks as one ``LongTensor[n_blocks, seq_len]``; raises when the corpus fills no block."""
    blocks = list(iter_token_blocks(tokenizer, texts, seq_len, max_tokens))
    if not blocks:
        raise DihalValueError(f"the corpus is shorter than one block of {seq_len} tokens")
    return torch.stack(blocks)
