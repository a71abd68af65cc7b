"""Documents cut into pieces the tokenizer can take one at a time, whatever their length.

A piece ends before a space that starts a word (a space followed by a non-space character), a pre-tokenizer
boundary of byte-level BPE, so the tokens of the pieces are those of the whole document; a window without
one is cut at :data:`PIECE_CHARS`. :class:`PieceCutter` makes the same cuts on text that arrives in parts
(a file read in chunks), so a 400 MB one-line file is never held whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

# Documents longer than this many characters are tokenized piece by piece, so memory follows the piece and
# not the document (a 25 MB one-line corpus took 5.6 GB whole).
PIECE_CHARS = 1 << 16

END = None  # in a stream of pieces: the end of a document


class PieceCutter:
    """The pieces of one document fed in parts: :meth:`feed` yields the pieces that are final, :meth:`finish`
    the rest. A piece is at most ``size`` characters."""

    def __init__(self, size: int = PIECE_CHARS) -> None:
        self.size = size
        self._parts: list[str] = []
        self._length = 0

    def feed(self, text: str) -> Iterator[str]:
        self._parts.append(text)
        self._length += len(text)
        # A cut at window end `size` looks at the character after it, so cut only once that one has arrived.
        if self._length >= self.size + 2:
            buffer = "".join(self._parts)
            start = 0
            while len(buffer) - start >= self.size + 2:
                end = _cut(buffer, start, self.size)
                yield buffer[start:end]
                start = end
            self._parts, self._length = [buffer[start:]], len(buffer) - start

    def finish(self) -> Iterator[str]:
        buffer, start = "".join(self._parts), 0
        while len(buffer) - start > self.size:
            end = _cut(buffer, start, self.size)
            yield buffer[start:end]
            start = end
        self._parts, self._length = [], 0
        yield buffer[start:]


def _cut(text: str, start: int, size: int) -> int:
    """Where the piece starting at ``start`` ends: before the last space followed by a non-space character in
    ``text[start + 1 : start + size + 1]``, else at ``start + size``."""
    end = start + size
    while end > start and not (text[end] == " " and end + 1 < len(text) and not text[end + 1].isspace()):
        end = text.rfind(" ", start + 1, end)
    return end if end > start else start + size


def document_pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """``text`` cut into pieces of at most ``size`` characters (see the module doc)."""
    cutter = PieceCutter(size)
    yield from cutter.feed(text)
    yield from cutter.finish()


def documents_as_pieces(texts: Iterable[str]) -> Iterator[str | None]:
    """Whole documents as a stream of pieces, each document's followed by :data:`END`."""
    for text in texts:
        yield from document_pieces(text)
        yield END
