"""Per-rank checkpoints of the collection state in ``RUN/collect/`` (atomic safetensors + JSON config)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save as save_safetensors

from dihal_fast.collect.config import CollectConfig
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

    def load(self, stats: LayerStatistics) -> dict | None:
        """Restore this rank's statistics into ``stats``; returns the progress, or ``None`` if no state was saved."""
        if not self.state_path.exists():
            logger.info("no checkpoint for rank %d in %s; this rank starts from the beginning", self.rank, self.dir)
            return None
        try:
            with safe_open(self.state_path, framework="pt") as handle:
                progress = json.loads(handle.metadata()["progress"])
                stats.load_state_dict({name: handle.get_tensor(name) for name in handle.keys()})
        except Exception as exc:  # safetensors/json raise several types for a damaged file
            raise ValueError(
                f"checkpoint {self.state_path} is corrupt or does not match this run ({type(exc).__name__}: {exc}); "
                "delete that file to recollect this process's share from the start with --resume, or use a new --out"
            ) from None
        logger.info("resuming rank %d from %s: %d blocks done", self.rank, self.state_path, progress["blocks_done"])
        return progress

