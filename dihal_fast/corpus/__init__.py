"""Reading corpora (text, JSONL, directories, saved HF datasets) and cutting them into token blocks with the
special tokens of the tokenizer's convention."""

from dihal_fast.corpus.blocks import CorpusBlocks, corpus_blocks, corpus_token_counts, iter_token_blocks, token_blocks
from dihal_fast.corpus.convention import TokenConvention, token_convention
from dihal_fast.corpus.reader import corpus_files, read_texts

__all__ = [
    "CorpusBlocks",
    "TokenConvention",
    "corpus_blocks",
    "corpus_token_counts",
    "corpus_files",
    "iter_token_blocks",
    "read_texts",
    "token_blocks",
    "token_convention",
]
