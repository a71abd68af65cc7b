"""NVTX ranges and their self-timing mode (dihal_fast.profiling)."""

from __future__ import annotations

import time

import numpy as np

import dihal_fast as df
from dihal_fast.profiling import nvtx_range, record_ranges


def test_nvtx_range_is_transparent_without_a_recorder():
    with nvtx_range("knn"):
        value = 1 + 1
    assert value == 2


def test_record_ranges_times_nested_ranges():
    with record_ranges(synchronize=False) as timings:
        with nvtx_range("outer"):
            time.sleep(0.02)
            for _ in range(3):
                with nvtx_range("inner"):
                    time.sleep(0.001)
    assert timings.counts == {"dihal/outer": 1, "dihal/inner": 3}
    assert timings.seconds["dihal/outer"] >= 0.02 + 3 * 0.001
    assert timings.seconds["dihal/inner"] >= 3 * 0.001
    assert timings.table().splitlines()[1].startswith("dihal/outer")
    with nvtx_range("after"):  # the recorder is gone after the block
        pass
    assert "dihal/after" not in timings.counts


def test_record_ranges_sees_the_proxy_stages():
    X = np.random.default_rng(0).standard_normal((200, 12))
    with record_ranges() as timings:
        df.geometry_proxies(X, k=5, n_pairs=100, backend="cpu")
    assert {"dihal/covariance", "dihal/knn", "dihal/local_eigen", "dihal/pairs", "dihal/top_eigen"} <= set(
        timings.counts
    )
