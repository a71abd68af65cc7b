"""Per-rank checkpoints of the collection state in ``RUN/collect/`` (atomic safetensors + JSON config)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save as save_safetensors

from dihal_fast.collect.config import CollectConfig
from dihal_fast.collect.reservoir import token_keys
from dihal_fast.collect.statistics import LayerStatistics
from dihal_fast.common import atomic_write_bytes, atomic_write_json, read_json
from dihal_fast.common.io import remove_stale_temporaries

logger = logging.getLogger(__name__)


class CheckpointStore:
    """``RUN/collect/config.json`` (the :class:`CollectConfig`) and one ``state-rank*.safetensors``
    per rank holding that rank's :class:`LayerStatistics` and its progress (in the metadata)."""

    def __init__(self, run_dir: str | Path, rank: int = 0, world_size: int = 1) -> None:
        self.dir = Path(run_dir) / "collect"
        self.rank, self.world_size = rank, world_size
        self.config_path = self.dir / "config.json"
        self.state_path = self.dir / f"state-rank{rank:04d}-of-{world_size:04d}.safetensors"

    def start(self, config: CollectConfig, resume: bool) -> None:
        """Check that ``RUN`` fits the request (fresh run or a resumable one) and save the config.

        Temporary files of this rank's checkpoint left by a killed run are deleted first."""
        for path in (self.state_path, self.config_path) if self.rank == 0 else (self.state_path,):
            remove_stale_temporaries(path)
        if resume:
            saved = read_json(self.config_path, "collection config to resume (from an earlier run with this --out)")
            if not isinstance(saved, dict):
                raise ValueError(f"{self.config_path} is not a collection config; it may be corrupt")
            diff = config.mismatches(saved)
            if diff:
                raise ValueError(f"cannot resume {self.dir}: the configuration changed ({'; '.join(diff)})")
            return
        existing = self.config_path if self.rank == 0 else self.state_path
        if existing.exists():
            raise ValueError(
                f"{self.dir} already holds a collection; pass --resume to continue it or choose a new --out"
            )
        if self.rank == 0:
            atomic_write_json(self.config_path, config.to_dict())

    def save(self, stats: LayerStatistics, progress: dict) -> None:
        """Write this rank's statistics and progress atomically (complete or absent, never partial)."""
        data = save_safetensors(stats.state_dict(), metadata={"progress": json.dumps(progress)})
        atomic_write_bytes(self.state_path, data)
        logger.debug("checkpoint %s (%d blocks, %.1f MB)", self.state_path, progress["blocks_done"], len(data) / 2**20)

    def load(self, stats: LayerStatistics, config: CollectConfig, vocab: int) -> dict | None:
        """Restore this rank's statistics into ``stats``; returns the progress, or ``None`` if no state was saved.

        Every invariant a real state satisfies is checked (:func:`check_collection_state`), so an edited or
        damaged file is refused with a line naming it and the field, never resumed into a different result."""
        if not self.state_path.exists():
            logger.info("no checkpoint for rank %d in %s; this rank starts from the beginning", self.rank, self.dir)
            return None
        try:
            with safe_open(self.state_path, framework="pt") as handle:
                progress = json.loads(handle.metadata()["progress"])
                stats.load_state_dict({name: handle.get_tensor(name) for name in handle.keys()})
            check_collection_state(stats, progress, config, self.rank, self.world_size, vocab)
        except Exception as exc:  # safetensors/json raise several types for a damaged file
            raise ValueError(
                f"checkpoint {self.state_path} is corrupt or does not match this run ({type(exc).__name__}: {exc}); "
                "delete that file to recollect this process's share from the start with --resume, or use a new --out"
            ) from None
        logger.info("resuming rank %d from %s: %d blocks done", self.rank, self.state_path, progress["blocks_done"])
        return progress


def check_collection_state(
    stats: LayerStatistics, progress: object, config: CollectConfig, rank: int, world: int, vocab: int
) -> None:
    """``ValueError`` naming the field unless ``stats`` and ``progress`` are what collecting ``progress["blocks_done"]``
    blocks of this rank gives: the token count, the reservoir's size, keys, positions and ids, finite vectors."""
    if not isinstance(progress, dict):
        raise ValueError(f"field 'progress' is {progress!r}, expected an object")
    for name in ("blocks_done", "batches_done"):
        value = progress.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"field 'progress.{name}' is {value!r}, expected a whole number >= 0")
    if not isinstance(progress.get("exhausted"), bool):
        raise ValueError(f"field 'progress.exhausted' is {progress.get('exhausted')!r}, expected true or false")
    blocks, batches = progress["blocks_done"], progress["batches_done"]
    total = config.total_blocks
    if total is not None and blocks > len(range(rank, total, world)):
        raise ValueError(
            f"field 'progress.blocks_done' is {blocks}, more than the {len(range(rank, total, world))} "
            f"blocks of this rank (--max-tokens {config.max_tokens})"
        )
    if not (batches - 1) * config.batch_size < blocks <= batches * config.batch_size and (blocks or batches):
        raise ValueError(
            f"field 'progress.batches_done' is {batches}, which cannot hold {blocks} blocks in batches of "
            f"{config.batch_size}"
        )
    per_block = config.seq_len - (0 if config.keep_first else 1)
    if stats.count != blocks * per_block:
        raise ValueError(
            f"field 'cov.*.count' is {stats.count}, but {blocks} blocks (field 'progress.blocks_done') hold "
            f"{blocks * per_block} tokens"
        )
    reservoir = stats.reservoir
    n = reservoir.size
    if n != min(reservoir.capacity, stats.count):
        raise ValueError(
            f"field 'reservoir.keys' holds {n} tokens, expected min(reservoir size "
            f"{reservoir.capacity}, {stats.count} tokens seen)"
        )
    positions, token_ids = reservoir.positions[:n], reservoir.token_ids[:n]
    if n and positions.min() < 0:
        raise ValueError(f"field 'reservoir.positions' holds {positions.min()}, a negative token position")
    block_index, offset = np.divmod(positions, config.seq_len)
    local = (block_index - rank) // world
    outside = ((block_index - rank) % world != 0) | (local >= blocks) | ((offset == 0) & (not config.keep_first))
    if outside.any():
        raise ValueError("field 'reservoir.positions' holds positions outside the blocks this rank has collected")
    if np.unique(positions).size != n:
        raise ValueError("field 'reservoir.positions' holds the same token more than once")
    if not np.array_equal(reservoir.keys[:n], token_keys(positions, stats.seed)):
        raise ValueError(
            f"field 'reservoir.keys' does not match the positions' keys (seed {stats.seed}): duplicated or "
            "edited tokens"
        )
    if n and (token_ids.min() < 0 or token_ids.max() >= vocab):
        raise ValueError(
            f"field 'reservoir.token_ids' holds ids from {token_ids.min()} to {token_ids.max()}, outside the "
            f"model's vocabulary 0..{vocab - 1}"
        )
    for layer in reservoir.layers:
        if not torch.isfinite(reservoir.layer_vectors(layer)).all():
            raise ValueError(f"field 'reservoir.vectors.{layer}' holds NaN or infinite values")
