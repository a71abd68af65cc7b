"""The collection configuration: saved next to every checkpoint and checked on ``--resume``."""

from __future__ import annotations

from dataclasses import dataclass, field

from dihal_fast.common.hf_loading import DTYPES
from dihal_fast.common.validation import CheckedConfig, checked
from dihal_fast.errors import DihalValueError

# Fields that may change between an interrupted run and its resumption without changing the result
# (beyond float rounding of the forward pass on another device).
RESUMABLE_CHANGES = ("device", "checkpoint_every")


@dataclass
class CollectConfig(CheckedConfig):
    """What to collect and how. ``max_tokens`` counts block tokens over all processes (``None``: the
    whole corpus); the statistics see fewer because the first position of each block is excluded
    unless ``keep_first``. ``reservoir_size`` tokens are kept per layer for the kNN/pair proxies. ``layers``: the
    hidden-state indices collected (``None``: every one, ``0..L``). Every field is checked when built
    (:mod:`dihal_fast.common.validation`; messages name the field)."""

    flag_names = False
    legacy = {"layers": None}  # runs saved before the field existed collected every hidden state

    model: str = checked()
    corpus: list[str] = field(default_factory=list)
    seq_len: int = checked(128, min=2)  # the first position of a block is special
    batch_size: int = checked(8, min=1)
    max_tokens: int | None = checked(None, min=1)
    reservoir_size: int = checked(30000, min=1)
    keep_first: bool = checked(False)
    dtype: str = checked("float32", choices=tuple(DTYPES))
    seed: int = checked(0)
    world_size: int = checked(1, min=1)
    device: str = checked("cpu", device=True)
    checkpoint_every: int = checked(100, min=1)
    layers: list[int] | None = checked(None, min=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_tokens is not None and self.max_tokens < self.seq_len:
            raise DihalValueError(
                f"max_tokens ({self.max_tokens}) must be at least one block of seq_len = {self.seq_len} tokens"
            )
        if not self.corpus:
            raise DihalValueError("corpus is empty: give at least one corpus path")
        if self.layers is not None and (not self.layers or self.layers != sorted(set(self.layers))):
            raise DihalValueError(
                f"layers must be distinct hidden-state indices in increasing order, got {self.layers}"
            )

    @property
    def total_blocks(self) -> int | None:
        """Blocks requested over all processes (``None``: as many as the corpus holds)."""
        return None if self.max_tokens is None else self.max_tokens // self.seq_len

    def mismatches(self, saved: dict) -> list[str]:
        """Fields (other than :data:`RESUMABLE_CHANGES`) where ``saved`` differs from this config."""
        return self.differences(saved, ignore=RESUMABLE_CHANGES)
