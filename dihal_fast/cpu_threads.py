"""How many CPU threads to use: the cores that other processes leave free.

Why: torch's and the compiled core's OpenMP pools (one libgomp, one pool) split each parallel loop evenly
over their threads and wait for the slowest. Beside another busy process one of two threads shares its
core, so every parallel region waits for a thread that gets half a core and the whole run is slower than
with one thread (``dihal replace --layer 1 --steps 60``: 1 thread 27.5 s, 2 threads 18.7 s when idle, 2
threads 55.6 s beside one busy process; ``bench/bench_contention.py``). So the ``dihal`` command measures
the load of *other* processes (busy CPU time in ``/proc/stat`` minus this process's own) and uses only the
free cores, and :class:`ThreadGovernor` re-checks at step boundaries of long loops.

``DIHAL_NUM_THREADS=N`` pins ``N`` threads (as does a user's ``OMP_NUM_THREADS``); unset or ``auto`` adapts.

The collapse itself comes from libgomp's spin-waiting: an idle worker spins up to ``GOMP_SPINCOUNT``
(300,000 by default, milliseconds) before it sleeps, so beside a busy process the spinning threads take
the CPU time the working thread needs (2 threads beside one busy process: 108-495 s and as much CPU time,
against 31-48 s with 1 thread). ``import dihal_fast`` therefore bounds the spin to :data:`SPIN_COUNT`
(set before libgomp loads, unless the user set ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY``), which keeps the
idle behaviour (back-to-back parallel regions still find the worker awake) and limits the damage while
the governor has not yet reacted to a new neighbour.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dihal_fast.errors import DihalValueError

logger = logging.getLogger(__name__)

ENV = "DIHAL_NUM_THREADS"
# A core that other processes keep busy more than this share of the time is not free. At 0.25, kernel work
# (page-cache flushes, kworkers) in a 2 s window sometimes cost an idle run its second thread: `dihal replace`
# took 1.16x the 2-thread time idle (bench_contention, best of 2); at 0.5 it takes 0.99x, and beside a busy
# process still one thread (1.03x the idle 1-thread time).
BUSY_SHARE = 0.5
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


SPIN_COUNT = 10_000  # libgomp spin iterations (~0.5 ms of PAUSE loops) before an idle worker sleeps


def configure_openmp() -> None:
    """Before libgomp is loaded (``import dihal_fast`` before ``import torch``): cap its spin-wait at
    :data:`SPIN_COUNT` unless the user chose a wait policy, and turn a pinned ``DIHAL_NUM_THREADS`` into
    ``OMP_NUM_THREADS`` so that library use (without the ``dihal`` command's governor) honours it too."""
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    value = os.environ.get(ENV, "").strip()
    if _positive_int(value):
        os.environ["OMP_NUM_THREADS"] = value


def _positive_int(text: str) -> int | None:
    """``text`` as a positive integer in ASCII digits, else None (``'²'`` and ``'٣'`` are digits to
    ``str.isdigit`` but not to libgomp, and ``int('²')`` raises)."""
    return int(text) if text.isascii() and text.isdigit() and int(text) > 0 else None


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


@dataclass(frozen=True)
class CpuSample:
    """Busy CPU seconds of the whole machine and of this process, at a wall-clock time."""

    machine: float
    own: float
    wall: float


def cpu_sample() -> CpuSample | None:
    """Now; None where ``/proc/stat`` cannot be read (not Linux)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    busy = sum(fields[:8]) - fields[3] - fields[4]  # user..steal, without idle and iowait
    return CpuSample(busy / _TICK, time.process_time(), time.monotonic())


def other_busy_cores(start: CpuSample, end: CpuSample) -> float:
    """Mean number of cores kept busy by other processes between two samples."""
    wall = end.wall - start.wall
    if wall <= 0:
        return 0.0
    return max(0.0, (end.machine - start.machine) - (end.own - start.own)) / wall


def choose_threads(cores: int, other_busy: float) -> int:
    """``cores`` minus the cores other processes keep busy (counted from :data:`BUSY_SHARE`), at least 1."""
    return max(1, min(cores, cores - math.ceil(other_busy - BUSY_SHARE)))


def pinned_threads() -> int | None:
    """The thread count the user fixed (``DIHAL_NUM_THREADS``, else ``OMP_NUM_THREADS``), or None for auto."""
    value = os.environ.get(ENV, "auto").strip().lower()
    if value in ("", "auto"):
        return _positive_int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip())
    count = _positive_int(value)
    if count is None:
        raise DihalValueError(f"{ENV} must be a positive integer or 'auto', got {os.environ[ENV]!r}")
    return count


def apply_threads(count: int) -> None:
    """Use ``count`` threads in torch's and the compiled core's shared OpenMP pool (set before or after
    torch is imported)."""
    if "torch" in sys.modules:
        import torch

        torch.set_num_threads(count)
    else:  # read once when libgomp loads
        os.environ["OMP_NUM_THREADS"] = str(count)


class ThreadGovernor:
    """Keeps the thread count at the free cores; :meth:`poll` at step boundaries is cheap and rate-limited.

    Pinned counts (see :func:`pinned_threads`) are applied once and never changed; a thread count set by
    someone else afterwards (``torch.set_num_threads``, e.g. a ``--threads`` option) pins it too.
    """

    def __init__(self, interval: float = 2.0, min_window: float = 0.05):
        self.interval, self.min_window = interval, min_window
        self.pinned, self.cores = pinned_threads(), usable_cores()
        self.threads: int | None = None
        self._last = cpu_sample()
        if self.pinned is not None:
            self._set(self.pinned)

    def _set(self, count: int) -> None:
        self.threads = count
        apply_threads(count)

    def _changed_elsewhere(self) -> bool:
        torch = sys.modules.get("torch")
        return self.threads is not None and torch is not None and torch.get_num_threads() != self.threads

    def poll(self) -> int | None:
        """Measure the other processes' load since the last reading (the first poll decides once at least
        ``min_window`` seconds have passed, later ones every ``interval`` seconds) and move the thread count
        to the free cores; returns the count in use (None while undecided)."""
        last = self._last
        if self.pinned is not None or last is None:
            return self.threads
        if self._changed_elsewhere():
            self.pinned = self.threads = sys.modules["torch"].get_num_threads()
            return self.threads
        now = cpu_sample()
        if now is None:  # /proc/stat stopped being readable: keep the count in use
            return self.threads
        if now.wall - last.wall < (self.interval if self.threads is not None else self.min_window):
            return self.threads
        other = other_busy_cores(last, now)
        count = choose_threads(self.cores, other)
        self._last = now
        if count != self.threads:
            logger.info("%d of %d CPU threads (other processes keep %.1f cores busy)", count, self.cores, other)
            self._set(count)
        return self.threads


_GOVERNOR: ThreadGovernor | None = None


def govern_threads() -> ThreadGovernor:
    """Start (or restart) the process-wide governor; the ``dihal`` command calls this first thing."""
    global _GOVERNOR
    _GOVERNOR = ThreadGovernor()
    return _GOVERNOR


def poll_threads() -> int | None:
    """:meth:`ThreadGovernor.poll` of the process-wide governor; nothing when none was started (library use
    keeps the caller's own thread settings)."""
    return _GOVERNOR.poll() if _GOVERNOR is not None else None
