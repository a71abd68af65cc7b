"""dihal_fast: diffusion inside pretrained language models.

The fast geometry proxies (stable public API, see DESIGN.md)::

    import dihal_fast as df
    df.geometry_proxies(X)            # {'m_curv', 'm_mono', 'k_eff'}
    df.selection_scores({layer: proxies, ...})
    df.StreamingCovariance(dim).update(batch)

Pipeline stages live in sub-packages (collect, select, bridge, hybrid, train, evaluate, hcdlm,
tasks) and behind the ``dihal`` command line.

Importing the package changes nothing in the process environment. The ``dihal`` command bounds libgomp's
spin-wait before torch loads (:func:`dihal_fast.cpu_threads.configure_openmp`); a library user who shares
the CPU with other busy processes can call that function before ``import torch`` to get the same.
"""

from dihal_fast._native import BackendUnavailable, build_info
from dihal_fast._version import __version__
from dihal_fast.geometry import (
    StreamingCovariance,
    curvature_proxy,
    effective_rank,
    geometry_proxies,
    knn,
    monotonicity_proxy,
    selection_scores,
)

__all__ = [
    "BackendUnavailable",
    "StreamingCovariance",
    "__version__",
    "build_info",
    "curvature_proxy",
    "effective_rank",
    "geometry_proxies",
    "knn",
    "monotonicity_proxy",
    "selection_scores",
]
