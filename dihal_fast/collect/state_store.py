"""Per-rank checkpoints of the collection state in ``RUN/collect/``, streamed to disk part by part.

A rank's state (a covariance per layer, the token reservoir with a vector table per layer) is written one part
at a time, each part a safetensors file written atomically (:func:`dihal_fast.common.io.atomic_write_bytes`)
into a fresh folder, so a save never holds more than one part's serialised bytes beside the state itself (a
single file would need the whole state twice over: ~44 GB at 32 layers x 4,096). The manifest naming the folder,
its files and the progress is written last: a save killed midway leaves the previous checkpoint whole, and the
unfinished folder is removed when the run starts again. A checkpoint of the earlier single-file layout
(``state-rank*.safetensors``) is still resumed.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save as save_safetensors

from dihal_fast.collect.config import CollectConfig
from dihal_fast.collect.reservoir import token_keys
from dihal_fast.collect.statistics import LayerStatistics
from dihal_fast.common import atomic_write_bytes, atomic_write_json, read_json
from dihal_fast.common.io import make_directories, remove_stale_temporaries
from dihal_fast.errors import DihalValueError

logger = logging.getLogger(__name__)

FORMAT = "dihal-collect-state/2"  # the manifest's format: parts folder + manifest


class CheckpointStore:
    """``RUN/collect/config.json`` (the :class:`CollectConfig`) and, per rank, the manifest
    ``state-rank*.json`` naming the folder ``state-rank*.parts-*`` that holds that rank's
    :class:`LayerStatistics` (one safetensors file per part) and its progress."""

    def __init__(self, run_dir: str | Path, rank: int = 0, world_size: int = 1) -> None:
        self.dir = Path(run_dir) / "collect"
        self.rank, self.world_size = rank, world_size
        self.config_path = self.dir / "config.json"
        stem = f"state-rank{rank:04d}-of-{world_size:04d}"
        self.manifest_path = self.dir / f"{stem}.json"
        self.legacy_path = self.dir / f"{stem}.safetensors"  # the single-file layout of earlier versions
        self._parts_prefix = f"{stem}.parts-"

    def start(self, config: CollectConfig, resume: bool) -> None:
        """Check that ``RUN`` fits the request (fresh run or a resumable one) and save the config.

        What a killed run left of this rank's checkpoint (temporary files, an unfinished parts folder) is
        deleted first."""
        for path in (self.manifest_path, self.legacy_path, *((self.config_path,) if self.rank == 0 else ())):
            remove_stale_temporaries(path)
        keep = self._manifest_parts()
        if keep is not None or not self.manifest_path.exists():  # an unreadable manifest: every folder is kept
            self._remove_parts(keep)
        if resume:
            saved = read_json(self.config_path, "collection config to resume (from an earlier run with this --out)")
            if not isinstance(saved, dict):
                raise DihalValueError(f"{self.config_path} is not a collection config; it may be corrupt")
            diff = config.mismatches(saved)
            if diff:
                raise DihalValueError(f"cannot resume {self.dir}: the configuration changed ({'; '.join(diff)})")
            return
        # A config without any checkpoint is a collection that stopped before its first batch (a bad corpus):
        # nothing to keep, so a corrected command starts afresh.
        if any(path.exists() for path in (self.manifest_path, self.legacy_path)):
            saved = read_json(self.config_path, "collection config") if self.config_path.is_file() else None
            diff = config.mismatches(saved) if isinstance(saved, dict) else [f"no config in {self.config_path}"]
            how = f"its configuration differs ({'; '.join(diff)})" if diff else "with this configuration"
            raise DihalValueError(
                f"{self.dir} already holds a collection, {how}; continue it with --resume (resume=True from "
                "Python) or choose a new --out"
            )
        if self.rank == 0:
            atomic_write_json(self.config_path, config.to_dict())

    def save(self, stats: LayerStatistics, progress: dict) -> None:
        """Write this rank's statistics part by part into a fresh folder, then the manifest naming it (the
        checkpoint switches to the new state at that rename), then delete the previous one."""
        folder = make_directories(self.dir / f"{self._parts_prefix}{secrets.token_hex(4)}")
        files, total = {}, 0
        for name, tensors in _parts(stats):
            data = save_safetensors(tensors)
            del tensors
            atomic_write_bytes(folder / name, data)
            files[name], total = len(data), total + len(data)
            del data  # the next part is serialised only after this one's bytes are freed
        manifest = {"format": FORMAT, "parts": folder.name, "files": files, "progress": progress}
        atomic_write_json(self.manifest_path, manifest)
        self._remove_parts(keep=folder.name)
        if self.legacy_path.exists():
            self.legacy_path.unlink()
        logger.debug("checkpoint %s (%d blocks, %.1f MB)", folder, progress["blocks_done"], total / 2**20)

    def load(self, stats: LayerStatistics, config: CollectConfig, vocab: int) -> dict | None:
        """Restore this rank's statistics into ``stats``; returns the progress, or ``None`` if no state was saved.

        Every invariant a real state satisfies is checked (:func:`check_collection_state`), so an edited or
        damaged file is refused with a line naming it and the field, never resumed into a different result."""
        path = self.manifest_path if self.manifest_path.exists() else self.legacy_path
        if not path.exists():
            logger.info("no checkpoint for rank %d in %s; this rank starts from the beginning", self.rank, self.dir)
            return None
        try:
            state, progress = self._read(path)
            stats.load_state_dict(state)
            del state
            check_collection_state(stats, progress, config, self.rank, self.world_size, vocab)
        except Exception as exc:  # safetensors/json raise several types for a damaged file
            raise DihalValueError(
                f"checkpoint {path} is corrupt or does not match this run ({type(exc).__name__}: {exc}); "
                "delete that file to recollect this process's share from the start with --resume, or use a new --out"
            ) from None
        logger.info("resuming rank %d from %s: %d blocks done", self.rank, path, progress["blocks_done"])
        return progress

    def _read(self, path: Path) -> tuple[Mapping[str, torch.Tensor], object]:
        """The state dict (each tensor read when asked for) and progress of the manifest or legacy file ``path``."""
        if path == self.legacy_path:
            with safe_open(path, framework="pt") as handle:
                progress = json.loads(handle.metadata()["progress"])
            return LazyTensors([path]), progress
        manifest = read_json(path, "collection checkpoint manifest")
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise DihalValueError(f"not a {FORMAT} manifest")
        folder, files = manifest.get("parts"), manifest.get("files")
        if not (isinstance(folder, str) and folder.startswith(self._parts_prefix) and Path(folder).name == folder):
            raise DihalValueError(f"field 'parts' is {folder!r}, expected a {self._parts_prefix}* folder beside it")
        if not isinstance(files, dict):
            raise DihalValueError(f"field 'files' is {files!r}, expected an object of file names and sizes")
        parts = []
        for name, size in files.items():
            part = self.dir / folder / str(name)
            if os.path.basename(str(name)) != name or not part.is_file() or part.stat().st_size != size:
                raise DihalValueError(f"part {part} is missing or not the {size} bytes the manifest records")
            parts.append(part)
        return LazyTensors(parts), manifest.get("progress")

    def _manifest_parts(self) -> str | None:
        """The parts folder the manifest names (``None`` when there is no readable manifest)."""
        try:
            manifest = json.loads(self.manifest_path.read_text())
        except (OSError, ValueError):
            return None
        return manifest.get("parts") if isinstance(manifest, dict) else None

    def _remove_parts(self, keep: str | None) -> None:
        """Delete this rank's parts folders other than ``keep`` (older states, or a save that was killed)."""
        for folder in self.dir.glob(f"{self._parts_prefix}*") if self.dir.is_dir() else ():
            if folder.name != keep and folder.is_dir() and not folder.is_symlink():
                shutil.rmtree(folder)
                logger.debug("removed %s (not the checkpoint the manifest names)", folder)


class LazyTensors(Mapping[str, torch.Tensor]):
    """The tensors of safetensors files by name, each read from its file when asked for (only the headers are read
    up front): restoring a state part by part never holds it twice."""

    def __init__(self, files: list[Path]) -> None:
        self._file: dict[str, Path] = {}
        for path in files:
            with safe_open(path, framework="pt") as handle:
                self._file.update(dict.fromkeys(handle.keys(), path))

    def __getitem__(self, name: str) -> torch.Tensor:
        with safe_open(self._file[name], framework="pt") as handle:
            return handle.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._file)

    def __len__(self) -> int:
        return len(self._file)


def remove_collection_state(run_dir: str | Path) -> int:
    """Delete every process's collection checkpoint in ``RUN/collect`` (``collect/config.json`` stays: it records
    what was collected), the manifests first, so that a kill midway leaves no manifest naming a missing part; returns
    the bytes freed."""
    folder = Path(run_dir) / "collect"
    states = sorted(folder.glob("state-rank*")) if folder.is_dir() else []
    freed = 0
    for path in sorted(states, key=lambda p: p.suffix != ".json"):
        if path.is_dir() and not path.is_symlink():
            freed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
        else:
            freed += path.stat().st_size
            path.unlink()
    return freed


def _parts(stats: LayerStatistics) -> Iterator[tuple[str, dict[str, torch.Tensor]]]:
    """``(file name, tensors)`` of each part of ``stats.state_dict()``, built one at a time: a covariance per
    layer, the reservoir's keys, positions and ids, and its vectors per layer (views, not copies)."""
    for layer, cov in stats.covariances.items():
        yield (
            f"cov-{layer}.safetensors",
            {f"cov.{layer}.{name}": torch.from_numpy(np.asarray(value)) for name, value in cov.state_dict().items()},
        )
    reservoir = stats.reservoir.state_dict()
    yield (
        "reservoir.safetensors",
        {f"reservoir.{name}": reservoir.pop(name) for name in ("keys", "positions", "token_ids")},
    )
    for layer in stats.layers:
        yield f"reservoir-{layer}.safetensors", {f"reservoir.vectors.{layer}": reservoir.pop(f"vectors.{layer}")}


def check_collection_state(
    stats: LayerStatistics, progress: object, config: CollectConfig, rank: int, world: int, vocab: int
) -> None:
    """``ValueError`` naming the field unless ``stats`` and ``progress`` are what collecting ``progress["blocks_done"]``
    blocks of this rank gives: the token count, the reservoir's size, keys, positions and ids, finite vectors."""
    if not isinstance(progress, dict):
        raise DihalValueError(f"field 'progress' is {progress!r}, expected an object")
    for name in ("blocks_done", "batches_done"):
        value = progress.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DihalValueError(f"field 'progress.{name}' is {value!r}, expected a whole number >= 0")
    if not isinstance(progress.get("exhausted"), bool):
        raise DihalValueError(f"field 'progress.exhausted' is {progress.get('exhausted')!r}, expected true or false")
    blocks, batches = progress["blocks_done"], progress["batches_done"]
    total = config.total_blocks
    if total is not None and blocks > len(range(rank, total, world)):
        raise DihalValueError(
            f"field 'progress.blocks_done' is {blocks}, more than the {len(range(rank, total, world))} "
            f"blocks of this rank (--max-tokens {config.max_tokens})"
        )
    if not (batches - 1) * config.batch_size < blocks <= batches * config.batch_size and (blocks or batches):
        raise DihalValueError(
            f"field 'progress.batches_done' is {batches}, which cannot hold {blocks} blocks in batches of "
            f"{config.batch_size}"
        )
    per_block = config.seq_len - (0 if config.keep_first else 1)
    if stats.count != blocks * per_block:
        raise DihalValueError(
            f"field 'cov.*.count' is {stats.count}, but {blocks} blocks (field 'progress.blocks_done') hold "
            f"{blocks * per_block} tokens"
        )
    reservoir = stats.reservoir
    n = reservoir.size
    if n != min(reservoir.capacity, stats.count):
        raise DihalValueError(
            f"field 'reservoir.keys' holds {n} tokens, expected min(reservoir size "
            f"{reservoir.capacity}, {stats.count} tokens seen)"
        )
    positions, token_ids = reservoir.positions[:n], reservoir.token_ids[:n]
    if n and positions.min() < 0:
        raise DihalValueError(f"field 'reservoir.positions' holds {positions.min()}, a negative token position")
    block_index, offset = np.divmod(positions, config.seq_len)
    local = (block_index - rank) // world
    outside = ((block_index - rank) % world != 0) | (local >= blocks) | ((offset == 0) & (not config.keep_first))
    if outside.any():
        raise DihalValueError("field 'reservoir.positions' holds positions outside the blocks this rank has collected")
    if np.unique(positions).size != n:
        raise DihalValueError("field 'reservoir.positions' holds the same token more than once")
    if not np.array_equal(reservoir.keys[:n], token_keys(positions, stats.seed)):
        raise DihalValueError(
            f"field 'reservoir.keys' does not match the positions' keys (seed {stats.seed}): duplicated or "
            "edited tokens"
        )
    if n and (token_ids.min() < 0 or token_ids.max() >= vocab):
        raise DihalValueError(
            f"field 'reservoir.token_ids' holds ids from {token_ids.min()} to {token_ids.max()}, outside the "
            f"model's vocabulary 0..{vocab - 1}"
        )
    for layer in reservoir.layers:
        if not torch.isfinite(reservoir.layer_vectors(layer)).all():
            raise DihalValueError(f"field 'reservoir.vectors.{layer}' holds NaN or infinite values")
