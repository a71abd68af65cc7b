"""Fixed-length token blocks from a stream of documents (documents joined by the EOS token)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


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
    this call yields those of ``rank``. ``max_tokens`` bounds the tokens yielded to this rank.
    """
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must satisfy 0 <= rank < world_size ({world_size}), got {rank}")
    eos = tokenizer.eos_token_id
    buffer: list[int] = []
    block_index, yielded = 0, 0
    for text in texts:
        buffer.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            buffer.append(eos)
        while len(buffer) >= seq_len:
            block, buffer = buffer[:seq_len], buffer[seq_len:]
            mine = block_index % world_size == rank
            block_index += 1
            if not mine:
                continue
            if max_tokens is not None and yielded + seq_len > max_tokens:
                return
            yielded += seq_len
            yield torch.tensor(block, dtype=torch.long)


def token_blocks(tokenizer, texts: Iterable[str], seq_len: int, max_tokens: int | None = None) -> torch.Tensor:
    """All blocks as one ``LongTensor[n_blocks, seq_len]``; raises when the corpus fills no block."""
    blocks = list(iter_token_blocks(tokenizer, texts, seq_len, max_tokens))
    if not blocks:
        raise ValueError(f"the corpus is shorter than one block of {seq_len} tokens")
    return torch.stack(blocks)
