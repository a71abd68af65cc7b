"""Does a busy neighbour make the CPU pipeline collapse?

Runs each workload in a fresh process under several conditions: alone with 1 thread, alone with 2
threads, alone with the default settings, and the same beside one deliberately busy single-threaded
process (``python -c 'while True: pass'``) started by this script. Thread settings are passed through
``DIHAL_NUM_THREADS`` (unset = the package's default: the free cores) and ``GOMP_SPINCOUNT`` (300,000 =
libgomp's own default, the behaviour before the spin-wait was bounded). Each row also gives the CPU that *other*
processes of the machine used during the run (busy CPU time from ``/proc/stat`` minus the workload's
and the neighbour's own), so that a polluted row can be seen as such; ratios within one run count.
Targets: beside one busy process the default is at most 1.2x the idle 1-thread time, and
the idle default is no slower than the idle 2-thread time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report, rows_figure, table  # noqa: E402

GEOMETRY = (
    "import numpy as np, dihal_fast as df\n"
    "X = np.random.default_rng(0).standard_normal((3000, 1024), dtype=np.float32)\n"
    "for _ in range({repeats}): df.geometry_proxies(X)\n"
)
BEFORE = {"DIHAL_NUM_THREADS": "2", "GOMP_SPINCOUNT": "300000"}  # libgomp's own default spin: the old behaviour
# (name, environment, busy neighbour?)
CONDITIONS = [
    ("idle, 1 thread", {"DIHAL_NUM_THREADS": "1"}, False),
    ("idle, 2 threads, old spin-wait", BEFORE, False),
    ("idle, default", {}, False),
    ("busy neighbour, 1 thread", {"DIHAL_NUM_THREADS": "1"}, True),
    ("busy neighbour, 2 threads, old spin-wait", BEFORE, True),
    ("busy neighbour, 2 threads, bounded spin-wait", {"DIHAL_NUM_THREADS": "2"}, True),
    ("busy neighbour, default", {}, True),
]
_TICK = os.sysconf("SC_CLK_TCK")


def busy_cpu_seconds() -> float:
    """CPU seconds all cores spent busy since boot (``/proc/stat``: everything but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / _TICK


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


@dataclass
class Run:
    seconds: float
    cpu_seconds: float  # the workload's own user + system time
    foreign_cores: float  # mean cores used by other processes (not the workload, not the neighbour)


def run_once(command: list[str], settings: dict[str, str], neighbour: bool) -> Run:
    """Wall and CPU time of ``command`` with the environment ``settings`` (thread variables of this
    process removed first), beside a busy neighbour or not."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIHAL_NUM_THREADS", "OMP_", "GOMP_"))}
    env.update(settings)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if neighbour else None
    try:
        if busy is not None:
            time.sleep(1.0)  # let it settle on a core
        neighbour_start = process_cpu_seconds(busy.pid) if busy is not None else 0.0
        machine_start, start = busy_cpu_seconds(), time.perf_counter()
        child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
        seconds, machine = time.perf_counter() - start, busy_cpu_seconds() - machine_start
        neighbour_cpu = process_cpu_seconds(busy.pid) - neighbour_start if busy is not None else 0.0
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {child.stderr.read().decode()[-2000:]}")
    cpu = usage.ru_utime + usage.ru_stime
    return Run(seconds, cpu, max(0.0, machine - cpu - neighbour_cpu) / seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["replace", "geometry"], choices=["replace", "geometry"])
    parser.add_argument("--steps", type=int, default=60, help="bridge training steps of the replace workload")
    parser.add_argument("--geometry-repeats", type=int, default=10, help="geometry_proxies calls at 3,000 x 1,024")
    parser.add_argument("--rounds", type=int, default=1, help="rounds over all conditions (the best time is kept)")
    parser.add_argument("--conditions", nargs="+", default=None, help="subset of the condition names")
    args = parser.parse_args()

    dihal = shutil.which("dihal") or str(Path(sys.executable).with_name("dihal"))
    conditions = [c for c in CONDITIONS if args.conditions is None or c[0] in args.conditions]
    load_before = os.getloadavg()
    sections, figures = [], {}
    for workload in args.workloads:
        results: dict[str, list[Run]] = {name: [] for name, _, _ in conditions}
        for _ in range(args.rounds):
            for name, settings, neighbour in conditions:
                with tempfile.TemporaryDirectory() as tmp:
                    if workload == "replace":
                        command = [dihal, "replace", "--layer", "1", "--steps", str(args.steps), "--out", tmp]
                    else:
                        command = [sys.executable, "-c", GEOMETRY.format(repeats=args.geometry_repeats)]
                    run = run_once(command, settings, neighbour)
                results[name].append(run)
                print(
                    f"{workload:8s} {name:44s} {run.seconds:7.2f} s  cpu {run.cpu_seconds:7.2f} s  "
                    f"other processes {run.foreign_cores:.2f} cores",
                    flush=True,
                )
        best = {name: min(runs, key=lambda r: r.seconds) for name, runs in results.items()}
        idle_one = best.get("idle, 1 thread")
        rows = [
            [name, run.seconds, run.cpu_seconds, run.foreign_cores, run.seconds / idle_one.seconds if idle_one else "-"]
            for name, run in best.items()
        ]
        label = (
            f"`dihal replace --layer 1 --steps {args.steps}`"
            if workload == "replace"
            else f"`geometry_proxies` 3,000 x 1,024 float32, {args.geometry_repeats} calls"
        )
        header = ["condition", "wall s", "own CPU s", "other processes (cores)", "/ idle 1 thread"]
        sections.append(f"{label}:\n\n" + table(header, rows))
        figures[workload] = rows_figure(header, rows)
    load_after = os.getloadavg()
    loads = (
        f"load averages (1, 5, 15 min) before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
        f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; best of {args.rounds} round(s)"
    )
    report(
        "Thread behaviour beside a busy neighbour",
        loads + "\n\n" + "\n\n".join(sections),
        question="thread_contention",
        figures={**figures, "rounds": args.rounds, "steps": args.steps},
    )


if __name__ == "__main__":
    main()
