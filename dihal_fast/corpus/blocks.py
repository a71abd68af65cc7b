"""Fixed-length token blocks from a stream of documents, each document with the special tokens its tokenizer's
model saw (:mod:`dihal_fast.corpus.convention`), every token labelled with the file it came from."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from dihal_fast.corpus.convention import TokenConvention, token_convention
from dihal_fast.corpus.pieces import END, PIECE_CHARS, document_pieces, documents_as_pieces
from dihal_fast.corpus.reader import Corpus
from dihal_fast.errors import DihalValueError

__all__ = [
    "PIECE_CHARS",
    "CorpusBlocks",
    "corpus_blocks",
    "corpus_token_counts",
    "document_pieces",
    "iter_token_blocks",
    "token_blocks",
]

Origin = tuple[tuple[str, int], ...]  # (file, tokens of the block from it), in the block's order
TEXTS = "texts"  # the file name of documents handed over as strings rather than a Corpus


@dataclass
class CorpusBlocks:
    """``blocks`` ``LongTensor[N, seq_len]``, the ``files`` read in order, and per block the files its tokens came
    from (``origins``)."""

    blocks: torch.Tensor
    files: list[str]
    origins: list[Origin]

    def __getitem__(self, rows: slice) -> CorpusBlocks:
        return CorpusBlocks(self.blocks[rows], self.files, self.origins[rows])

    def tokens_per_file(self) -> dict[str, int]:
        """Tokens of the blocks per file (every file named, in reading order)."""
        return _count(self.files, self.origins)


def iter_token_blocks(
    tokenizer,
    texts: Iterable[str],
    seq_len: int,
    max_tokens: int | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[torch.Tensor]:
    """Yield ``LongTensor[seq_len]`` blocks cut from the documents' token stream (:func:`_labelled_blocks`).

    With ``world_size > 1`` the blocks are dealt round-robin and this call yields those of ``rank``.
    ``max_tokens`` bounds the tokens of all ranks' blocks together, and reading stops there.
    """
    if not 0 <= rank < world_size:
        raise DihalValueError(f"rank must satisfy 0 <= rank < world_size ({world_size}), got {rank}")
    for index, (block, _) in enumerate(_labelled_blocks(token_convention(tokenizer), texts, seq_len, max_tokens)):
        if index % world_size == rank:
            yield torch.tensor(block, dtype=torch.long)


def corpus_blocks(
    tokenizer, texts: Iterable[str], seq_len: int, max_tokens: int | None = None, required: bool = False
) -> CorpusBlocks:
    """Every block (at most ``max_tokens`` tokens) with the files it came from; none is an empty tensor, or with
    ``required`` an error."""
    files, _ = _sources(texts)
    blocks, origins = [], []
    for block, origin in _labelled_blocks(token_convention(tokenizer), texts, seq_len, max_tokens):
        blocks.append(block)
        origins.append(origin)
    if required and not blocks:
        raise DihalValueError(f"the corpus is shorter than one block of {seq_len} tokens")
    tensor = torch.tensor(blocks, dtype=torch.long) if blocks else torch.empty((0, seq_len), dtype=torch.long)
    return CorpusBlocks(tensor, files, origins)


def corpus_token_counts(tokenizer, texts: Iterable[str], seq_len: int, max_tokens: int | None = None) -> dict[str, int]:
    """Tokens per file of every rank's blocks that :func:`iter_token_blocks` cuts, counted without keeping them."""
    files, _ = _sources(texts)
    return _count(
        files, (origin for _, origin in _labelled_blocks(token_convention(tokenizer), texts, seq_len, max_tokens))
    )


def _count(files: list[str], origins: Iterable[Origin]) -> dict[str, int]:
    """``{file: tokens}`` over ``origins``, every one of ``files`` named, in reading order."""
    counts = dict.fromkeys(files, 0)
    for origin in origins:
        for name, count in origin:
            counts[name] += count
    return counts


def token_blocks(tokenizer, texts: Iterable[str], seq_len: int, max_tokens: int | None = None) -> torch.Tensor:
    """All blocks as one ``LongTensor[n_blocks, seq_len]``; raises when the corpus fills no block."""
    return corpus_blocks(tokenizer, texts, seq_len, max_tokens, required=True).blocks


def _labelled_blocks(
    convention: TokenConvention, texts: Iterable[str], seq_len: int, max_tokens: int | None
) -> Iterator[tuple[list[int], Origin]]:
    """Every block of ``seq_len`` tokens of the documents joined into one stream, with its :data:`Origin`.

    Each document is ``convention.prefix + text + convention.suffix``; the remainder that fills no block is
    dropped. With ``max_tokens`` and several files, each file gives at most an equal share of the whole blocks
    ``max_tokens`` holds (what a short file leaves is shared by the files after it), so every file is drawn
    from, in the order given, and reading a file stops at its share. Documents are tokenized in pieces
    (:func:`document_pieces`); a :class:`Corpus` (what :func:`~dihal_fast.corpus.read_texts` returns) is read
    piece by piece from its files, so memory is bounded by :data:`PIECE_CHARS` and the blocks, whatever the length
    of a file or a line.
    """
    if seq_len < 2:
        raise DihalValueError(f"seq_len must be >= 2, got {seq_len}")
    files, sources = _sources(texts)
    budget = None if max_tokens is None else max_tokens // seq_len * seq_len
    stream, taken, cut = _Stream(), 0, 0
    for index, (name, pieces) in enumerate(sources):
        share = None if budget is None else -(-(budget - taken) // (len(files) - index))
        used = 0
        for ids in _document_ids(convention, pieces):
            ids = ids if share is None else ids[: share - used]
            used += len(ids)
            stream.add(ids, name)
            for block in stream.blocks(seq_len):
                yield block
                cut += seq_len
                if cut == budget:
                    return
            if used == share:
                break
        taken += used


def _sources(texts: Iterable[str]) -> tuple[list[str], Iterator[tuple[str, Iterable[str | None]]]]:
    """The file names of ``texts`` and, lazily, ``(file, its pieces)`` for each (strings: one file, ``TEXTS``)."""
    if isinstance(texts, Corpus):
        return [str(path) for path in texts.files()], ((str(path), pieces) for path, pieces in texts.sources())
    return [TEXTS], iter([(TEXTS, documents_as_pieces(texts))])


def _document_ids(convention: TokenConvention, pieces: Iterable[str | None]) -> Iterator[list[int]]:
    """The token ids of each piece, the convention's prefix before a document's first and its suffix at its end."""
    starting = True
    for piece in pieces:
        ids = [] if piece is END else convention.encode(piece)
        if starting:
            ids = [*convention.prefix, *ids]
        yield [*ids, *convention.suffix] if piece is END else ids
        starting = piece is END


class _Stream:
    """Tokens waiting to fill a block, with runs ``[file, count]`` saying where they came from."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.runs: deque[list] = deque()

    def add(self, ids: list[int], name: str) -> None:
        if not ids:
            return
        self.ids.extend(ids)
        if self.runs and self.runs[-1][0] == name:
            self.runs[-1][1] += len(ids)
        else:
            self.runs.append([name, len(ids)])

    def blocks(self, seq_len: int) -> Iterator[tuple[list[int], Origin]]:
        """Every whole block the stream holds, in order; the tokens left fill no block."""
        start = 0
        while len(self.ids) - start >= seq_len:
            yield self.ids[start : start + seq_len], self._origin(seq_len)
            start += seq_len
        del self.ids[:start]

    def _origin(self, n: int) -> Origin:
        parts = []
        while n:
            name, count = self.runs[0]
            take = min(n, count)
            parts.append((name, take))
            n -= take
            if take == count:
                self.runs.popleft()
            else:
                self.runs[0][1] -= take
        return tuple(parts)
