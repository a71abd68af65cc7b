"""Per-layer safetensors files of the sampled vectors (for later sweeps), with a JSON sidecar."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch
from safetensors.torch import save as save_safetensors

from dihal_fast.collect.reservoir import TokenReservoir
from dihal_fast.common import atomic_write_bytes, atomic_write_json
from dihal_fast.errors import DihalValueError

logger = logging.getLogger(__name__)


def shard_bytes(reservoir: TokenReservoir) -> int:
    """Bytes the shard files of ``reservoir`` take (vectors plus the position and token-id columns)."""
    vectors = reservoir.size * reservoir.dim * reservoir.vectors[reservoir.layers[0]].element_size()
    return len(reservoir.layers) * (vectors + 2 * 8 * reservoir.size)


def write_shards(reservoir: TokenReservoir, out_dir: str | Path, metadata: dict) -> list[Path]:
    """Write ``layer_XXX.safetensors`` (``vectors`` ``n x D`` in the hidden-state dtype, ``positions``
    = global token index, ``token_ids``) per layer and ``metadata.json``; rows are in key order.

    The disk space is logged before writing, and checked against the free space of ``out_dir``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ordered = reservoir.sorted()
    needed = shard_bytes(ordered)
    free = shutil.disk_usage(out).free
    logger.info(
        "writing %d shard files of %d tokens to %s: %.1f MB (%.1f MB free)",
        len(ordered.layers),
        ordered.size,
        out,
        needed / 2**20,
        free / 2**20,
    )
    if needed > free:
        raise DihalValueError(f"shards need {needed / 2**20:.1f} MB but {out} has only {free / 2**20:.1f} MB free")
    files = []
    columns = {"positions": ordered.positions[: ordered.size], "token_ids": ordered.token_ids[: ordered.size]}
    for layer in ordered.layers:
        tensors = {"vectors": ordered.layer_vectors(layer).contiguous()}
        tensors.update({name: torch.from_numpy(values.copy()) for name, values in columns.items()})
        path = out / f"layer_{layer:03d}.safetensors"
        atomic_write_bytes(path, save_safetensors(tensors, metadata={"layer": str(layer)}))
        files.append(path)
    atomic_write_json(
        out / "metadata.json",
        {
            **metadata,
            "layers": list(ordered.layers),
            "n_tokens": ordered.size,
            "dim": ordered.dim,
            "dtype": str(ordered.dtype).replace("torch.", ""),
            "files": [p.name for p in files],
            "bytes": needed,
            "row_order": "ascending sampling key (a uniform random order); positions = block * seq_len + offset",
        },
    )
    return files
