"""Selection score across candidate layers (DESIGN.md): which hidden state is most diffusion-friendly."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from dihal_fast.errors import DihalTypeError, DihalValueError
from dihal_fast.geometry.inputs import check_real

PROXY_NAMES = ("m_curv", "m_mono", "k_eff")


def _zscore(values: np.ndarray) -> np.ndarray:
    """Standardise with the population std; a column that is constant up to rounding scores 0."""
    mean, sd = values.mean(), values.std()
    if sd <= 1e-12 * max(1.0, abs(mean)):
        return np.zeros_like(values)
    return (values - mean) / sd


def selection_scores(proxies_by_layer: Mapping[int, Mapping[str, float]]) -> tuple[dict[int, float], int]:
    """``score(l) = z(log m_curv) + z(log m_mono) - z(log k_eff)``; returns ``({layer: score}, l*)``.

    ``l*`` is the argmax, ties to the shallower layer. Layers are integer keys, at least two; every proxy must
    be a real number (not a string or a bool), finite and > 0.
    """
    if not isinstance(proxies_by_layer, Mapping):
        raise DihalTypeError(
            f"proxies_by_layer must map layer numbers to proxies, got {type(proxies_by_layer).__name__}"
        )
    bad_keys = [key for key in proxies_by_layer if isinstance(key, bool) or not isinstance(key, (int, np.integer))]
    if bad_keys:
        raise DihalTypeError(f"layer keys must be integers (hidden-state indices), got {bad_keys[:3]!r}")
    if not proxies_by_layer:
        raise DihalValueError("proxies_by_layer is empty: give the proxies of at least two candidate layers")
    layers = sorted(proxies_by_layer)
    logs = {}
    for name in PROXY_NAMES:
        column = []
        for layer in layers:
            entry = proxies_by_layer[layer]
            if not isinstance(entry, Mapping):
                raise DihalTypeError(f"layer {layer}: the proxies must be a mapping of names to numbers, got {entry!r}")
            if name not in entry:
                raise DihalValueError(f"layer {layer} has no {name!r} (expected keys {PROXY_NAMES})")
            value = check_real(entry[name], f"layer {layer}: {name}")
            if not (math.isfinite(value) and value > 0):
                raise DihalValueError(f"layer {layer}: {name} must be finite and > 0, got {value!r}")
            column.append(math.log(value))
        logs[name] = np.array(column)
    if len(layers) < 2:
        raise DihalValueError(
            f"selection compares layers: give the proxies of at least 2 candidate layers, got {layers} "
            "(a z-score across one layer is 0 whatever its geometry)"
        )
    score = _zscore(logs["m_curv"]) + _zscore(logs["m_mono"]) - _zscore(logs["k_eff"])
    best = layers[int(np.argmax(score))]  # argmax returns the first maximum: the shallower layer
    return {layer: float(s) for layer, s in zip(layers, score)}, best
