"""glibc's allocator kept from handing training tensors back to the kernel after every step.

Why: glibc serves a request above its mmap threshold with a fresh ``mmap`` and unmaps it on ``free``; its
dynamic threshold grows only to 32 MiB, and a freed heap top above the trim threshold is returned too. A
CPU training step allocates and frees the same few hundred MB of activations and gradients every step,
so every step page-faults them in again and the kernel zeroes every page: on ``tiny-qwen3-16l``'s layer
sweep (one thread) about 47,000 minor faults per layer-step and 15-19 % of the process's CPU time in the
kernel (``bench/bench_allocator.py``). Fixing the mmap threshold at :data:`MMAP_THRESHOLD` and raising the
trim threshold to :data:`TRIM_THRESHOLD` keeps those pages in the heap between steps: system time falls to
3 %, CPU time by 10 %, peak memory grows by 2-4 %, and the numbers are the same bits (only where memory comes
from changes).

The ``dihal`` command calls :func:`configure_malloc` first thing; ``import dihal_fast`` changes nothing.
A user's own choice wins: with any of glibc's ``MALLOC_*_`` variables or a ``glibc.malloc`` tunable in
``GLIBC_TUNABLES`` set, or ``DIHAL_MALLOC=glibc``, glibc's settings stay as they are. Not glibc (musl,
macOS): nothing to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

from dihal_fast.errors import DihalValueError

logger = logging.getLogger(__name__)

ENV = "DIHAL_MALLOC"  # "tuned" (default) or "glibc" (leave the allocator alone)
MMAP_THRESHOLD = 32 << 20  # bytes: glibc's own largest dynamic threshold, fixed; larger requests still get a mapping
TRIM_THRESHOLD = 256 << 20  # bytes of free heap top kept before glibc returns it to the kernel
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_APPLIED = False  # set by configure_malloc in this process (worker processes repeat it: see applied())


def user_chose_malloc() -> bool:
    """Whether the environment already sets glibc's allocator (then it is left alone)."""
    return any(name in os.environ for name in _USER_SETTINGS) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "")


def configure_malloc() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (see the module docstring); True when set.

    Raises ValueError for a ``DIHAL_MALLOC`` value other than ``tuned`` or ``glibc``.
    """
    mode = os.environ.get(ENV, "tuned").strip().lower() or "tuned"
    if mode not in ("tuned", "glibc"):
        raise DihalValueError(f"{ENV} must be 'tuned' or 'glibc', got {os.environ[ENV]!r}")
    if mode == "glibc" or user_chose_malloc():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - present only in glibc
    except (OSError, AttributeError):
        logger.debug("not glibc: the allocator keeps its settings")
        return False
    global _APPLIED
    done = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    logger.debug("glibc malloc: mmap threshold %d, trim threshold %d (%s)", MMAP_THRESHOLD, TRIM_THRESHOLD, done)
    _APPLIED = _APPLIED or done
    return done


def applied() -> bool:
    """Whether :func:`configure_malloc` set the thresholds in this process: a process that spawns workers for the
    same job passes this on, and the workers call :func:`configure_malloc` too (a spawned process starts with
    glibc's defaults)."""
    return _APPLIED
