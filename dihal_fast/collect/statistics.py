"""Per-layer statistics of a stream of hidden states: exact covariance and a token reservoir."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from dihal_fast.collect.reservoir import TokenReservoir, token_keys
from dihal_fast.errors import DihalValueError
from dihal_fast.geometry import StreamingCovariance
from dihal_fast.profiling import nvtx_range


def token_mask(attention_mask: torch.Tensor, keep_first: bool) -> torch.Tensor:
    """Tokens that enter the statistics: not padding and, unless ``keep_first``, not the first real token.

    ``attention_mask`` is ``batch x seq`` (1 = real token); the first real token of each row (the
    attention sink, which carries massive activations) is dropped whatever the padding side.
    """
    mask = attention_mask.bool().clone()
    if not keep_first:
        has_tokens = mask.any(dim=1)
        first = mask.int().argmax(dim=1)
        rows = torch.arange(mask.shape[0], device=mask.device)[has_tokens]
        mask[rows, first[has_tokens]] = False
    return mask


class LayerStatistics:
    """A :class:`StreamingCovariance` per hidden-state index and one :class:`TokenReservoir` for all.

    Memory is ``O(len(layers) * dim^2 + reservoir_size * len(layers) * dim)`` whatever the number of
    tokens. Mergeable across processes (:meth:`merge`) and serialisable (:meth:`state_dict`).
    """

    def __init__(
        self, layers: Sequence[int], dim: int, reservoir_size: int, dtype: torch.dtype = torch.float32, seed: int = 0
    ) -> None:
        self.layers, self.dim, self.seed = tuple(layers), int(dim), int(seed)
        self.covariances = {layer: StreamingCovariance(self.dim) for layer in self.layers}
        self.reservoir = TokenReservoir(reservoir_size, self.layers, self.dim, dtype)

    @property
    def count(self) -> int:
        """Tokens that entered the statistics (the same for every layer)."""
        return self.covariances[self.layers[0]].count

    def update(
        self,
        hidden_states: Sequence[torch.Tensor] | Mapping[int, torch.Tensor],
        mask: torch.Tensor,
        positions: torch.Tensor,
        input_ids: torch.Tensor,
    ) -> int:
        """Add one batch: ``hidden_states[layer]`` (a sequence of every hidden state, or a mapping holding these
        layers') is ``batch x seq x dim``; ``mask``, ``positions`` (global token index, int64) and ``input_ids`` are
        ``batch x seq``. Returns the tokens added."""
        flat = mask.reshape(-1).nonzero().squeeze(1)
        if flat.numel() == 0:
            return 0
        token_positions = positions.reshape(-1)[flat].cpu().numpy()
        rows: dict[int, torch.Tensor] = {}
        for layer in self.layers:
            h = hidden_states[layer]
            rows[layer] = h.reshape(-1, h.shape[-1]).index_select(0, flat)
            self.covariances[layer].update(rows[layer])  # on the GPU for CUDA hidden states
        with nvtx_range("reservoir"):
            self.reservoir.offer(
                token_keys(token_positions, self.seed), token_positions, input_ids.reshape(-1)[flat].cpu().numpy(), rows
            )
        return int(flat.numel())

    def merge(self, other: LayerStatistics) -> LayerStatistics:
        """Count-weighted pairwise merge of every covariance; bottom-k merge of the reservoirs."""
        if other.layers != self.layers or other.seed != self.seed:
            raise DihalValueError("cannot merge statistics collected with different layers or seeds")
        for layer in self.layers:
            self.covariances[layer].merge(other.covariances[layer])
        self.reservoir.merge(other.reservoir)
        return self

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every covariance state (``cov.<layer>.<name>``) and the reservoir (``reservoir.<name>``)."""
        state: dict[str, torch.Tensor] = {}
        for layer, cov in self.covariances.items():
            for name, value in cov.state_dict().items():
                state[f"cov.{layer}.{name}"] = torch.from_numpy(np.array(value))  # keeps 0-d counts 0-d
        for name, value in self.reservoir.state_dict().items():
            state[f"reservoir.{name}"] = value
        return state

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> LayerStatistics:
        """Restore :meth:`state_dict` output (raises ``ValueError`` on a mismatch); each tensor is read once, when
        it is restored (a lazy ``state`` holds one at a time)."""
        for layer, cov in self.covariances.items():
            prefix = f"cov.{layer}."
            cov.load_state_dict({k[len(prefix) :]: state[k].numpy() for k in state if k.startswith(prefix)})
        self.reservoir.load_state_dict(state, prefix="reservoir.")
        counts = {cov.count for cov in self.covariances.values()}
        if len(counts) != 1:
            raise DihalValueError(
                f"statistics state is inconsistent: layers have different token counts {sorted(counts)}"
            )
        return self
