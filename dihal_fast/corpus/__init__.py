"""Reading corpora (text, JSONL, directories, saved HF datasets) and cutting them into token blocks."""

from dihal_fast.corpus.blocks import iter_token_blocks, token_blocks
from dihal_fast.corpus.reader import corpus_files, read_texts

__all__ = ["corpus_files", "iter_token_blocks", "read_texts", "token_blocks"]
