"""A mergeable uniform sample of tokens: the ``capacity`` tokens with the smallest seeded random keys.

Every token gets a key that is a seeded hash of its *global* position in the corpus, so the sample
depends only on which tokens were seen, never on batch sizes, process counts or resume points:
merging two reservoirs (from two batches, two ranks or a checkpoint and the rest of the run) keeps
the ``capacity`` smallest keys of the union, which is exactly the sample a single pass would keep.
Because the keys are i.i.d. uniform in the hash, the kept tokens are a uniform sample without
replacement of all tokens seen. One key per token is shared by all layers, so every layer's sample
holds the same tokens (paired across depth).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from dihal_fast.errors import DihalValueError

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a bijection of uint64 with good avalanche (vectorised, wrapping)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def token_keys(positions: np.ndarray, seed: int) -> np.ndarray:
    """uint64 sampling keys of tokens at global ``positions`` (int64); distinct positions get distinct keys."""
    positions = np.asarray(positions, dtype=np.int64)
    salt = _splitmix64(np.array([int(seed) & int(_MASK64)], dtype=np.uint64))
    return _splitmix64(positions.astype(np.uint64) ^ salt)


class TokenReservoir:
    """Bottom-``capacity`` sample of tokens by key, with each token's vector at every layer.

    Slots ``0..size-1`` of ``keys``, ``positions`` (global token index), ``token_ids`` (vocabulary id)
    and ``vectors[layer]`` (``capacity x dim`` tensor on the host, in the hidden-state dtype) are
    filled; slot order is arbitrary until :meth:`sorted` puts the tokens in key order.
    """

    def __init__(self, capacity: int, layers: Sequence[int], dim: int, dtype: torch.dtype = torch.float32) -> None:
        if capacity < 1:
            raise DihalValueError(f"reservoir capacity must be >= 1, got {capacity}")
        self.capacity, self.layers, self.dim, self.dtype = int(capacity), tuple(layers), int(dim), dtype
        self.size = 0
        self.keys = np.zeros(self.capacity, dtype=np.uint64)
        self.positions = np.zeros(self.capacity, dtype=np.int64)
        self.token_ids = np.zeros(self.capacity, dtype=np.int64)
        self.vectors = {layer: torch.empty(self.capacity, self.dim, dtype=dtype) for layer in self.layers}

    def offer(
        self,
        keys: np.ndarray,
        positions: np.ndarray,
        token_ids: np.ndarray,
        vectors: Mapping[int, torch.Tensor],
    ) -> int:
        """Offer ``c`` tokens (keys, positions, ids: length ``c``; ``vectors[layer]``: ``c x dim``, any device).

        Keeps the ``capacity`` smallest keys of the reservoir and the offer; returns how many offered
        tokens were admitted. Only admitted rows are copied to the host.
        """
        keys = np.asarray(keys, dtype=np.uint64)
        candidates = np.arange(keys.size)
        if self.size == self.capacity and keys.size:
            candidates = np.flatnonzero(keys < self.keys.max())
        if candidates.size == 0:
            return 0
        pool = np.concatenate([self.keys[: self.size], keys[candidates]])
        if pool.size <= self.capacity:
            admitted, slots = candidates, np.arange(self.size, pool.size)
        else:
            kept = np.zeros(pool.size, dtype=bool)
            kept[np.argpartition(pool, self.capacity - 1)[: self.capacity]] = True
            evicted = np.flatnonzero(~kept[: self.size])
            slots = np.concatenate([evicted, np.arange(self.size, self.capacity)])
            admitted = candidates[kept[self.size :]]
        self._write(
            slots, keys[admitted], np.asarray(positions)[admitted], np.asarray(token_ids)[admitted], vectors, admitted
        )
        self.size = min(self.capacity, pool.size)
        return int(admitted.size)

    def _write(self, slots, keys, positions, token_ids, vectors: Mapping[int, torch.Tensor], rows: np.ndarray) -> None:
        missing = set(self.layers) - set(vectors)
        if missing:
            raise DihalValueError(f"offered vectors lack layers {sorted(missing)}")
        self.keys[slots], self.positions[slots], self.token_ids[slots] = keys, positions, token_ids
        slot_index = torch.from_numpy(slots)
        for layer in self.layers:
            source = vectors[layer]
            row_index = torch.from_numpy(rows).to(source.device)
            self.vectors[layer][slot_index] = source.index_select(0, row_index).to("cpu", self.dtype)

    def merge(self, other: TokenReservoir) -> TokenReservoir:
        """Fold another reservoir (disjoint tokens, same layers/dim) into this one; unbiased by construction."""
        if other.layers != self.layers or other.dim != self.dim:
            raise DihalValueError(
                f"cannot merge reservoirs of layers {other.layers} / dim {other.dim} into layers {self.layers} / dim "
                f"{self.dim}"
            )
        n = other.size
        self.offer(
            other.keys[:n], other.positions[:n], other.token_ids[:n], {l: other.vectors[l][:n] for l in other.layers}
        )
        return self

    def sorted(self) -> TokenReservoir:
        """Put the tokens in key order (the canonical order for estimates and files), in place, and return
        ``self``: one layer's vectors are copied at a time, never the whole reservoir."""
        keys = self.keys[: self.size]
        if np.all(keys[1:] > keys[:-1]):  # (not np.diff: uint64 differences wrap around)
            return self
        order = np.argsort(keys, kind="stable")
        n, index = self.size, torch.from_numpy(order)
        self.keys[:n], self.positions[:n], self.token_ids[:n] = (
            keys[order],
            self.positions[order],
            self.token_ids[order],
        )
        for layer in self.layers:
            self.vectors[layer][:n] = self.vectors[layer][:n].index_select(0, index)
        return self

    def layer_vectors(self, layer: int) -> torch.Tensor:
        """The ``size x dim`` sampled vectors of ``layer`` (a view)."""
        return self.vectors[layer][: self.size]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Filled part of the reservoir as tensors (keys bit-cast to int64 for safetensors)."""
        n = self.size
        state = {
            "keys": torch.from_numpy(self.keys[:n].view(np.int64).copy()),
            "positions": torch.from_numpy(self.positions[:n].copy()),
            "token_ids": torch.from_numpy(self.token_ids[:n].copy()),
        }
        for layer in self.layers:
            state[f"vectors.{layer}"] = self.vectors[layer][:n].contiguous()
        return state

    def load_state_dict(self, state: Mapping[str, torch.Tensor], prefix: str = "") -> TokenReservoir:
        """Restore :meth:`state_dict` output (its keys after ``prefix``), checking sizes, layers and dtype; the vectors
        are read one layer at a time (a lazy ``state`` then never holds the reservoir twice)."""
        try:
            keys = state[f"{prefix}keys"].numpy().view(np.uint64)
            positions, token_ids = state[f"{prefix}positions"].numpy(), state[f"{prefix}token_ids"].numpy()
        except KeyError as exc:
            raise DihalValueError(f"reservoir state is missing {exc.args[0]!r}") from None
        n = keys.size
        if n > self.capacity or positions.size != n or token_ids.size != n:
            raise DihalValueError(
                f"reservoir state does not fit capacity {self.capacity} ({n} keys, {positions.size} positions, "
                f"{token_ids.size} token ids)"
            )
        for layer in self.layers:
            name = f"{prefix}vectors.{layer}"
            if name not in state:
                raise DihalValueError(f"reservoir state is missing {name!r}")
            vectors = state[name]
            if tuple(vectors.shape) != (n, self.dim) or vectors.dtype != self.dtype:
                raise DihalValueError(
                    f"reservoir state does not fit capacity {self.capacity}, dim {self.dim}, dtype {self.dtype} "
                    f"({n} keys; mismatching layers: [{layer}])"
                )
            self.vectors[layer][:n] = vectors
            del vectors
        self.size = n
        self.keys[:n], self.positions[:n], self.token_ids[:n] = keys, positions, token_ids
        return self
