"""The collection configuration: saved next to every checkpoint and checked on ``--resume``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from dihal_fast.common.models import DTYPES

# Fields that may change between an interrupted run and its resumption without changing the result
# (beyond float rounding of the forward pass on another device).
RESUMABLE_CHANGES = ("device", "checkpoint_every")


@dataclass
class CollectConfig:
    """What to collect and how. ``max_tokens`` counts block tokens over all processes (``None``: the
    whole corpus); the statistics see fewer because the first position of each block is excluded
    unless ``keep_first``. ``reservoir_size`` tokens are kept per layer for the kNN/pair proxies."""

    model: str
    corpus: list[str] = field(default_factory=list)
    seq_len: int = 128
    batch_size: int = 8
    max_tokens: int | None = None
    reservoir_size: int = 30000
    keep_first: bool = False
    dtype: str = "float32"
    seed: int = 0
    world_size: int = 1
    device: str = "cpu"
    checkpoint_every: int = 100

    def __post_init__(self) -> None:
        positive = {
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "reservoir_size": self.reservoir_size,
            "world_size": self.world_size,
            "checkpoint_every": self.checkpoint_every,
        }
        for name, value in positive.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.seq_len < 2:
            raise ValueError(f"seq_len must be >= 2 (the first position of a block is special), got {self.seq_len}")
        if self.max_tokens is not None and self.max_tokens < self.seq_len:
            raise ValueError(
                f"max_tokens ({self.max_tokens}) must be at least one block of seq_len = {self.seq_len} tokens"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if not self.corpus:
            raise ValueError("corpus is empty: give at least one corpus path")

    @property
    def total_blocks(self) -> int | None:
        """Blocks requested over all processes (``None``: as many as the corpus holds)."""
        return None if self.max_tokens is None else self.max_tokens // self.seq_len

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def mismatches(self, saved: dict) -> list[str]:
        """Fields (other than :data:`RESUMABLE_CHANGES`) where ``saved`` differs from this config."""
        mine = self.to_dict()
        return [
            f"{name}: saved {saved.get(name)!r}, now {mine[name]!r}"
            for name in mine
            if name not in RESUMABLE_CHANGES and saved.get(name) != mine[name]
        ]
