"""dihal_fast: diffusion inside pretrained language models.

The fast geometry proxies (stable public API, see DESIGN.md)::

    import dihal_fast as df
    df.geometry_proxies(X)            # {'m_curv', 'm_mono', 'k_eff'}
    df.selection_scores({layer: proxies, ...})
    df.StreamingCovariance(dim).update(batch)

Pipeline stages live in sub-packages (collect, select, bridge, hybrid, train, evaluate, hcdlm,
tasks) and behind the ``dihal`` command line.
"""
from dihal_fast.cpu_threads import configure_openmp

configure_openmp()  # before torch or the compiled core loads libgomp; see dihal_fast.cpu_threads
from dihal_fast._native import BackendUnavailable, build_info  # noqa: E402
from dihal_fast._version import __version__  # noqa: E402
from dihal_fast.geometry import (  # noqa: E402
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
