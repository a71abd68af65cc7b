"""NVTX ranges around pipeline stages (no-ops unless a profiler such as Nsight Systems is attached).

Range names are shared with the C++/CUDA kernels: ``dihal/<stage>`` (collect, covariance, knn,
local_eigen, pairs, bridge_step, ...), all in the ``dihal_fast`` domain.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import nvtx

DOMAIN = "dihal_fast"


@contextlib.contextmanager
def nvtx_range(stage: str) -> Iterator[None]:
    """Annotate the enclosed block as ``dihal/<stage>``."""
    with nvtx.annotate(f"dihal/{stage}", domain=DOMAIN):
        yield
