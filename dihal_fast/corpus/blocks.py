"""Fixed-length token blocks from a stream of documents (documents joined by the EOS token)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from dihal_fast.corpus.pieces import END, PIECE_CHARS, document_pieces, documents_as_pieces
from dihal_fast.corpus.reader import Corpus
from dihal_fast.errors import DihalValueError

__all__ = ["PIECE_CHARS", "document_pieces", "iter_token_blocks", "token_blocks"]


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
    this call yields those of ``rank``. ``max_tokens`` bounds the tokens yielded to this rank, and reading
    stops there. Documents are tokenized in pieces (:func:`document_pieces`); a :class:`Corpus` (what
    :func:`~dihal_fast.corpus.read_texts` returns) is read piece by piece from its files, so memory is bounded
    by :data:`PIECE_CHARS` and the blocks, whatever the length of a file or a line.
    """
    if seq_len < 2:
        raise DihalValueError(f"seq_len must be >= 2, got {seq_len}")
    if not 0 <= rank < world_size:
        raise DihalValueError(f"rank must satisfy 0 <= rank < world_size ({world_size}), got {rank}")
    buffer: list[int] = []
    block_index, yielded = 0, 0
    for ids in _token_ids(tokenizer, texts.pieces() if isinstance(texts, Corpus) else documents_as_pieces(texts)):
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


def _token_ids(tokenizer, pieces: Iterable[str | None]) -> Iterator[list[int]]:
    """The token ids of each piece, and the EOS (when the tokenizer has one) at each document's end."""
    eos = tokenizer.eos_token_id
    for piece in pieces:
        if piece is not END:
            yield tokenizer(piece, add_special_tokens=False)["input_ids"]
        elif eos is not None:
            yield [eos]


def token_blocks(tokenizer, texts: Iterable[str], seq_len: int, max_tokens: int | None = None) -> torch.Tensor:
    """All blocks as one ``LongTensor[n_blocks, seq_len]``; raises when the corpus fills no block."""
    blocks = list(iter_token_blocks(tokenizer, texts, seq_len, max_tokens))
    if not blocks:
        raise DihalValueError(f"the corpus is shorter than one block of {seq_len} tokens")
    return torch.stack(blocks)
