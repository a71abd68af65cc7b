"""What a CPU layer sweep gains from worker processes (``dihal sweep --workers``) over one process.

The same ``dihal sweep`` (every candidate layer of ``tiny-qwen3-16l``, a short budget, 3 score runs) three
ways: one process with one thread, one process with ``--threads-per-process`` threads (``--workers 1``, what
the command did before), and ``--workers N`` one-thread processes. Per run: wall time, the CPU time of the
command and its workers (``wait4``), peak memory of the largest process, and the layers' bridge losses (the
one-thread process and the workers must agree to the bit). Wall times are only comparable on an otherwise
idle machine: the record says the load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report, run_sweep, table, target  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="tiny-qwen3-16l", help="shipped backbone name or checkpoint directory")
    parser.add_argument("--budget-steps", type=int, default=20, help="bridge steps per layer")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of the third run")
    parser.add_argument("--threads-per-process", type=int, default=2, help="threads of the second run's one process")
    args = parser.parse_args()
    if min(args.budget_steps, args.workers, args.threads_per_process) < 1:
        parser.error("--budget-steps, --workers and --threads-per-process must be >= 1")

    base = ["--model", args.model, "--budget-steps", str(args.budget_steps), "--score-repeats", "3"]
    ways = [
        ("one process, 1 thread", ["--workers", "1"], "1"),
        (f"one process, {args.threads_per_process} threads", ["--workers", "1"], str(args.threads_per_process)),
        (f"{args.workers} worker processes, 1 thread each", ["--workers", str(args.workers)], "1"),
    ]
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for i, (name, extra, threads) in enumerate(ways):
            runs.append(run_sweep([*base, *extra], Path(tmp) / str(i), DIHAL_NUM_THREADS=threads))
            print(name, runs[-1], flush=True)
    one, threaded, workers = runs
    rows = [
        [name, run.wall_s, run.user_s + run.sys_s, run.max_rss_mb, one.wall_s / run.wall_s]
        for (name, _, _), run in zip(ways, runs)
    ]
    same = workers.losses == one.losses
    layers = len(one.losses)
    body = (
        f"`dihal sweep --model {args.model} --budget-steps {args.budget_steps} --score-repeats 3` ({layers} "
        f"layers), load average {load_before:.1f} before and {os.getloadavg()[0]:.1f} after:\n\n"
        + table(["run", "wall s", "CPU s", "peak RSS MB (largest process)", "speed-up vs one thread"], rows)
        + "\n\nBridge losses of the workers and of the one-thread process: "
        + ("identical." if same else "DIFFER.")
    )
    report(
        f"Layer sweep: worker processes against one process ({Path(args.model).name}, bench_sweep_workers.py)",
        body,
        question="sweep_workers",
        figures={"runs": {name: vars(run) for (name, _, _), run in zip(ways, runs)}, "load_before": load_before},
        targets=[
            target("the workers' bridge losses equal the one-thread run's", "identical" if same else "differ", same),
            target(
                f"{args.workers} workers faster than one process with {args.threads_per_process} threads",
                f"{threaded.wall_s / workers.wall_s:.2f}x",
                workers.wall_s < threaded.wall_s,
            ),
        ],
    )


if __name__ == "__main__":
    main()
