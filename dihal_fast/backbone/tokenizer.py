"""Byte-level BPE tokenizer training and corpus encoding (one token stream per document)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dihal_fast.errors import DihalValueError

PAD, BOS, EOS = "<pad>", "<s>", "</s>"


def train_tokenizer(texts: Sequence[str], vocab_size: int):
    """Train a byte-level BPE tokenizer on ``texts``; returns a ``PreTrainedTokenizerFast`` with bos/eos/pad.

    Byte-level means every UTF-8 string is encodable (no unknown token) and decoding is lossless.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 3 + 1:
        raise DihalValueError(
            f"vocab size must be at least {len(alphabet) + 4} (256 bytes + 3 special + 1 merge), got {vocab_size}"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, clean_up_tokenization_spaces=False
    )


def encode_documents(tokenizer, texts: Sequence[str]) -> np.ndarray:
    """Token ids of ``texts`` as one int32 stream, each document wrapped as ``<s> ... </s>``."""
    parts = []
    for text in texts:
        ids = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
        parts.append(np.asarray([tokenizer.bos_token_id, *ids, tokenizer.eos_token_id], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
