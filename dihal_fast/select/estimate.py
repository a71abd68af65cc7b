"""Repeated-subsample estimates of the three proxies per layer, the selection score and ``l*``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from dihal_fast.common.progress import progress_bar
from dihal_fast.errors import DihalValueError
from dihal_fast.geometry import geometry_proxies, selection_scores
from dihal_fast.geometry.selection import PROXY_NAMES

DEFAULT_REPEATS = 10
DEFAULT_SAMPLE_SIZE = 3000


@dataclass
class GeometryEstimate:
    """Per-repeat proxies and scores of the candidate ``layers``.

    ``values[name]`` is a ``repeats x len(layers)`` float64 array for ``m_curv``, ``m_mono``,
    ``k_eff`` and ``score``. Standard deviations are across repeats (``ddof = 1``; ``None`` for a
    single repeat).
    """

    layers: list[int]
    values: dict[str, np.ndarray]
    config: dict = field(default_factory=dict)

    @property
    def repeats(self) -> int:
        return int(self.values["score"].shape[0])

    @property
    def selected_layer(self) -> int:
        """``argmax`` over layers of the mean score across repeats, ties to the shallower layer."""
        return self.layers[int(np.argmax(self.values["score"].mean(axis=0)))]

    def mean_std(self, name: str, log: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """Mean and standard deviation across repeats of ``name`` (or of its natural log) per layer."""
        v = np.log(self.values[name]) if log else self.values[name]
        return v.mean(axis=0), (v.std(axis=0, ddof=1) if self.repeats > 1 else None)

    def summary(self) -> list[dict]:
        """One entry per layer: ``layer`` and ``{"mean", "std"}`` of each raw proxy, of its log and of the score."""
        stats = {name: self.mean_std(name) for name in (*PROXY_NAMES, "score")}
        stats.update({f"log_{name}": self.mean_std(name, log=True) for name in PROXY_NAMES})
        rows = []
        for i, layer in enumerate(self.layers):
            row: dict = {"layer": layer}
            for name, (mean, std) in stats.items():
                row[name] = {"mean": float(mean[i]), "std": None if std is None else float(std[i])}
            rows.append(row)
        return rows


def _check_sample(vectors: Mapping[int, torch.Tensor], layers: Sequence[int], sample_size: int, repeats: int) -> int:
    if len(layers) < 2:
        raise DihalValueError(
            f"the selection score z-scores across layers: give at least 2 candidate layers, got {list(layers)}"
        )
    missing = [l for l in layers if l not in vectors]
    if missing:
        raise DihalValueError(f"no sampled vectors for layers {missing} (available: {sorted(vectors)})")
    sizes = {int(vectors[l].shape[0]) for l in layers}
    if len(sizes) != 1:
        raise DihalValueError(f"every layer must hold the same sampled tokens; got row counts {sorted(sizes)}")
    available = sizes.pop()
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise DihalValueError(f"repeats must be a positive integer, got {repeats!r}")
    if isinstance(sample_size, bool) or not isinstance(sample_size, int) or sample_size < 2:
        raise DihalValueError(f"sample size must be an integer >= 2, got {sample_size!r}")
    if sample_size > available:
        raise DihalValueError(
            f"sample size {sample_size} exceeds the {available} sampled tokens available; "
            "lower --sample-size or collect more tokens (--max-tokens, --reservoir-size)"
        )
    return available


def subsample(available: int, sample_size: int, seed: int, repeat: int) -> tuple[np.ndarray, int]:
    """Repeat ``repeat``'s rows (sorted, without replacement) and its ``m_mono`` pair seed."""
    rng = np.random.default_rng([seed, repeat])
    rows = np.sort(rng.choice(available, size=sample_size, replace=False))
    return rows, int(rng.integers(2**31))


def estimate_geometry(
    vectors: Mapping[int, torch.Tensor | np.ndarray],
    layers: Sequence[int],
    *,
    repeats: int = DEFAULT_REPEATS,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    k: int = 16,
    ridge: float = 1e-3,
    n_pairs: int = 10000,
    seed: int = 0,
    backend: str = "auto",
    precision: str = "float64",
    progress: bool = False,
) -> GeometryEstimate:
    """Proxies of each layer on ``repeats`` seeded subsamples of ``sample_size`` tokens, and the score.

    ``vectors[layer]`` is ``m x D`` (the same ``m`` tokens in the same order at every layer). Repeat
    ``r`` uses the rows and ``m_mono`` pair seed of :func:`subsample` (the same rows at every layer,
    so layers are compared on the same tokens); the score of repeat ``r`` is :func:`selection_scores` of that
    repeat's proxies.
    ``precision`` is that of :func:`dihal_fast.geometry_proxies`.
    """
    layers = sorted(int(l) for l in layers)
    available = _check_sample(vectors, layers, sample_size, repeats)
    values = {name: np.empty((repeats, len(layers))) for name in (*PROXY_NAMES, "score")}
    bar = progress_bar(total=repeats * len(layers), desc="proxies", unit="layer", disable=not progress)
    for r in range(repeats):
        rows, pair_seed = subsample(available, sample_size, seed, r)
        proxies = {}
        for layer in layers:
            X = vectors[layer][torch.from_numpy(rows) if torch.is_tensor(vectors[layer]) else rows]
            proxies[layer] = geometry_proxies(
                X, k=k, ridge=ridge, n_pairs=n_pairs, seed=pair_seed, backend=backend, precision=precision
            )
            bar.update(1)
        scores, _ = selection_scores(proxies)
        for i, layer in enumerate(layers):
            for name in PROXY_NAMES:
                values[name][r, i] = proxies[layer][name]
            values["score"][r, i] = scores[layer]
    bar.close()
    config = dict(
        repeats=repeats,
        sample_size=sample_size,
        available=available,
        k=k,
        ridge=ridge,
        n_pairs=n_pairs,
        seed=seed,
        precision=precision,
        std="across repeats, ddof=1",
    )
    return GeometryEstimate(layers, values, config)
