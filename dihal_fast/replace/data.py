"""Token blocks for bridge training: a training set, a held-out validation set, and a deterministic
batch order that depends only on ``(seed, step)`` so that resuming needs nothing but the step."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from dihal_fast.corpus import corpus_blocks, read_texts, token_convention
from dihal_fast.errors import DihalValueError

logger = logging.getLogger(__name__)


@dataclass
class Blocks:
    """``train`` ``(N, T)`` and ``val`` ``(M, T)`` LongTensors of token ids, and where they came from
    (``provenance``, for reports: ``corpus_tokens`` ``{"train": {file: tokens}, "validation": {...}}`` and the
    ``documents`` convention of :func:`~dihal_fast.corpus.token_convention`)."""

    train: torch.Tensor
    val: torch.Tensor
    provenance: dict = field(default_factory=dict)


def load_blocks(
    tokenizer,
    corpus: str | os.PathLike | Sequence[str | os.PathLike],
    seq_len: int,
    val_blocks: int,
    max_train_tokens: int = 0,
    val_corpus: str | os.PathLike | None = None,
) -> Blocks:
    """Cut ``corpus`` into blocks; the validation set is ``val_corpus``'s first blocks, else the corpus tail."""
    limit = max_train_tokens or None
    if val_corpus is not None:
        read = corpus_blocks(tokenizer, read_texts(corpus), seq_len, limit)
        held = corpus_blocks(tokenizer, read_texts(val_corpus), seq_len, val_blocks * seq_len)
        train, val = slice(None), slice(None)
        if held.blocks.shape[0] < val_blocks:
            raise DihalValueError(
                f"validation corpus {val_corpus} fills {held.blocks.shape[0]} blocks of {seq_len} tokens; need "
                f"{val_blocks}"
            )
    else:
        read = held = corpus_blocks(
            tokenizer, read_texts(corpus), seq_len, limit + val_blocks * seq_len if limit else None
        )
        train, val = slice(None, -val_blocks), slice(-val_blocks, None)
    read, held = read[train], held[val]
    n_train, n_val = read.blocks.shape[0], held.blocks.shape[0]
    if not n_train or n_val < val_blocks:
        raise DihalValueError(
            f"corpus {corpus} gives {n_train + n_val} blocks of {seq_len} tokens; need more than --val-blocks "
            f"({val_blocks}) so that some remain for training (use a larger corpus or smaller --seq-len/--val-blocks)"
        )
    logger.info("corpus: %d training and %d validation blocks of %d tokens", n_train, n_val, seq_len)
    provenance = {
        "corpus_tokens": {"train": read.tokens_per_file(), "validation": held.tokens_per_file()},
        "documents": token_convention(tokenizer).describe(),
    }
    return Blocks(read.blocks, held.blocks, provenance)


def batch_indices(step: int, n_blocks: int, batch_size: int, world_size: int, rank: int, seed: int) -> torch.Tensor:
    """Rows of the training set for ``rank`` at ``step``: a slice of the global batch of a per-epoch permutation."""
    global_batch = batch_size * world_size
    if n_blocks < global_batch:
        raise DihalValueError(
            f"{n_blocks} training blocks cannot fill a global batch of {global_batch} "
            f"({batch_size} per process x {world_size} processes)"
        )
    per_epoch = n_blocks // global_batch
    epoch, index = divmod(step, per_epoch)
    order = torch.randperm(n_blocks, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    start = index * global_batch + rank * batch_size
    return order[start : start + batch_size]


def step_generator(seed: int, step: int, rank: int) -> torch.Generator:
    """The generator of a step's diffusion times and noise: a function of ``(seed, step, rank)`` only."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_009 + rank)
