"""Geometry of hidden states: the three DiHAL proxies, the selection score and streaming covariance."""

from dihal_fast.geometry.backends import BACKENDS
from dihal_fast.geometry.covariance import StreamingCovariance
from dihal_fast.geometry.inputs import MatrixLike
from dihal_fast.geometry.proxies import (
    curvature_proxy,
    effective_rank,
    geometry_proxies,
    knn,
    monotonicity_proxy,
)
from dihal_fast.geometry.selection import selection_scores

__all__ = [
    "BACKENDS",
    "MatrixLike",
    "StreamingCovariance",
    "curvature_proxy",
    "effective_rank",
    "geometry_proxies",
    "knn",
    "monotonicity_proxy",
    "selection_scores",
]
