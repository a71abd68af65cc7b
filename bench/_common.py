"""Shared benchmark plumbing: timing, the machine's GEMM rate, markdown tables, RESULTS.md."""
from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def best_time(fn: Callable[[], object], repeat: int = 3, warmup: int = 1) -> float:
    """Best wall time of ``repeat`` calls after ``warmup`` calls (seconds)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def sgemm_rate(size: int = 3072) -> float:
    """The machine's float32 matrix-multiply rate (GFLOP/s): best of NumPy and torch, same threads."""
    import torch

    rng = np.random.default_rng(0)
    A = rng.standard_normal((size, size), dtype=np.float32)
    B = rng.standard_normal((size, size), dtype=np.float32)
    tA, tB = torch.from_numpy(A), torch.from_numpy(B)
    flops = 2.0 * size**3
    return max(flops / best_time(lambda: A @ B) / 1e9, flops / best_time(lambda: tA @ tB) / 1e9)


def machine() -> str:
    """One line naming the machine the numbers come from."""
    import torch

    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}"


def table(header: list[str], rows: list[list[object]]) -> str:
    """A markdown table."""
    def fmt(v: object) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def report(title: str, body: str) -> None:
    """Print ``body`` and append it to bench/RESULTS.md with the exact command and machine."""
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0])] + sys.argv[1:])
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    text = f"\n## {title}\n\n`{command}` ({stamp}; {machine()})\n\n{body}\n"
    print(text)
    with RESULTS.open("a") as handle:
        handle.write(text)
