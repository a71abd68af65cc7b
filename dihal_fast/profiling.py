"""NVTX ranges around pipeline stages (no-ops unless a profiler such as Nsight Systems is attached).

Range names are shared with the C++/CUDA kernels: ``dihal/<stage>`` (collect, covariance, knn,
local_eigen, pairs, bridge_step, ...), all in the ``dihal_fast`` domain.

Without a profiler, :func:`record_ranges` times the same ranges itself::

    with record_ranges() as timings:
        df.geometry_proxies(X)
    print(timings.table())
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import nvtx

DOMAIN = "dihal_fast"


@dataclass
class RangeTimings:
    """Wall-clock seconds and entry counts per range name (nested ranges are counted inclusively)."""

    seconds: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    synchronize: bool = True
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, elapsed: float) -> None:
        with self._lock:
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed
            self.counts[name] = self.counts.get(name, 0) + 1

    def table(self) -> str:
        """A plain-text table, slowest range first."""
        rows = sorted(self.seconds.items(), key=lambda item: -item[1])
        lines = [f"{'range':<28} {'calls':>7} {'total ms':>11} {'mean ms':>10}"]
        for name, total in rows:
            calls = self.counts[name]
            lines.append(f"{name:<28} {calls:>7d} {1e3 * total:>11.3f} {1e3 * total / calls:>10.3f}")
        return "\n".join(lines)


_recorder: RangeTimings | None = None


def _synchronize_cuda() -> None:
    # Only when torch is already imported and has touched a GPU: never imports torch or creates a context.
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@contextlib.contextmanager
def record_ranges(synchronize: bool = True) -> Iterator[RangeTimings]:
    """Time every :func:`nvtx_range` entered inside the block.

    With ``synchronize`` pending CUDA work is waited for at each range edge, so GPU time is charged
    to the range that queued it (this serialises the GPU, as a profiler's timeline would not).
    """
    global _recorder
    previous, _recorder = _recorder, RangeTimings(synchronize=synchronize)
    try:
        yield _recorder
    finally:
        _recorder = previous


@contextlib.contextmanager
def nvtx_range(stage: str) -> Iterator[None]:
    """Annotate the enclosed block as ``dihal/<stage>`` (and time it inside :func:`record_ranges`)."""
    name = f"dihal/{stage}"
    recorder = _recorder
    if recorder is None:
        with nvtx.annotate(name, domain=DOMAIN):
            yield
        return
    if recorder.synchronize:
        _synchronize_cuda()
    start = time.perf_counter()
    try:
        with nvtx.annotate(name, domain=DOMAIN):
            yield
    finally:
        if recorder.synchronize:
            _synchronize_cuda()
        recorder.add(name, time.perf_counter() - start)
