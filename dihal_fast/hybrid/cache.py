"""``HybridCache``: what incremental decoding of a hybrid keeps, as one transformers ``Cache``.

It *is* the retained layers' ``DynamicCache`` (so ``generate``, ``get_seq_length``, beam reordering and the
retained model's own attention use it unchanged) and carries the bridge's context-encoder keys/values and
the noise definition (seed, shared across rows or per row) of the sequence being decoded.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from dihal_fast.bridge import BridgeCache


class HybridCache(DynamicCache):
    """Retained-layer KV cache + bridge cache + noise seed; ``shared_noise`` = one noise draw for every row."""

    def __init__(self, upper_config, context_layers: int, seed: int, shared_noise: bool):
        super().__init__(config=upper_config)
        self.bridge = BridgeCache(context_layers)
        self.seed, self.shared_noise = int(seed), bool(shared_noise)

    @property
    def length(self) -> int:
        """Tokens seen so far (by the bridge; the retained layers hold the same number)."""
        return self.bridge.length

    def _select_rows(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` of the bridge's own keys/values (the copied layers' cache selects its own)."""
        self.bridge.layers = [
            None
            if kv is None
            else (kv[0].index_select(0, index.to(kv[0].device)), kv[1].index_select(0, index.to(kv[1].device)))
            for kv in self.bridge.layers
        ]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self._select_rows(beam_idx)
        if self.bridge.copied is not None:
            self.bridge.copied.reorder_cache(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._select_rows(indices)
        if self.bridge.copied is not None:
            self.bridge.copied.batch_select_indices(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        if self.bridge.copied is not None:
            self.bridge.copied.batch_repeat_interleave(repeats)
        first = next((kv for kv in self.bridge.layers if kv is not None), None)
        if first is not None:
            self._select_rows(torch.arange(first[0].shape[0]).repeat_interleave(repeats))

    def crop(self, max_length: int) -> None:
        keep = max_length if max_length >= 0 else self.length + max_length
        super().crop(max_length)
        if self.bridge.copied is not None:
            self.bridge.copied.crop(max_length)
        self.bridge.layers = [
            None if kv is None else (kv[0][:, :, :keep], kv[1][:, :, :keep]) for kv in self.bridge.layers
        ]
