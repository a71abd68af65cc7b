"""Layer selection: repeated-subsample proxy estimates per layer, the selection score, ``l*`` and its plot.

from dihal_fast.select import estimate_geometry, plot_geometry
est = estimate_geometry({l: X_l for l in layers}, layers, repeats=10, sample_size=3000)
est.selected_layer, est.summary()
"""

from dihal_fast.select.estimate import (
    DEFAULT_REPEATS,
    DEFAULT_SAMPLE_SIZE,
    GeometryEstimate,
    estimate_geometry,
    subsample,
)
from dihal_fast.select.plot import plot_geometry

__all__ = [
    "DEFAULT_REPEATS",
    "DEFAULT_SAMPLE_SIZE",
    "GeometryEstimate",
    "estimate_geometry",
    "plot_geometry",
    "subsample",
]
