"""Unconditional text: fixed-length windows of a tokenised corpus (the shipped backbone's tokenizer)."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import torch

from dihal_fast.errors import DihalValueError
from dihal_fast.tasks.base import EvalExample, TaskSpec

logger = logging.getLogger(__name__)


def tokenize_files(tokenizer, files: list[Path], max_chars: int | None = None) -> torch.Tensor:
    """All files' token ids, concatenated (documents separated by EOS when the tokenizer has one)."""
    ids: list[int] = []
    for path in files:
        if not Path(path).is_file():
            raise FileNotFoundError(f"text file not found: {path}")
        text = Path(path).read_text(encoding="utf-8")[:max_chars]
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if tokenizer.eos_token_id is not None:
            ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


class TextTask:
    """Random ``seq_len``-token windows of the training corpus; no context."""

    def __init__(self, tokenizer, seq_len: int = 64, tokens: torch.Tensor | None = None) -> None:
        self.tokenizer = tokenizer
        self.tokens = tokens
        if tokens is not None and len(tokens) <= seq_len:
            raise DihalValueError(f"the text corpus has {len(tokens)} tokens, fewer than seq_len={seq_len}")
        self.spec = TaskSpec("text", target_vocab=len(tokenizer), target_len=seq_len)

    def train_batch(self, rng: random.Random, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.tokens is None:
            raise DihalValueError("the text task has no training corpus")
        starts = [rng.randrange(len(self.tokens) - self.spec.target_len) for _ in range(batch_size)]
        target = torch.stack([self.tokens[s : s + self.spec.target_len] for s in starts])
        return torch.zeros(batch_size, 0, dtype=torch.long), target

    def render(self, target: list[int]) -> str:
        return self.tokenizer.decode(target, skip_special_tokens=True)

    def score(self, example: EvalExample, target: list[int]) -> dict[str, float]:
        raise DihalValueError("text samples are scored with Gen PPL and entropy, not per-example correctness")
