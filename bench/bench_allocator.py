"""What glibc's default allocator costs CPU training, and what the ``dihal`` command's setting saves.

Runs the same ``dihal sweep`` (``tiny-qwen3-16l``, a few candidate layers, a short bridge budget, one
thread) with ``DIHAL_MALLOC=glibc`` (glibc's defaults) and ``DIHAL_MALLOC=tuned`` (the command's default:
:func:`dihal_fast.cpu_malloc.configure_malloc`), alternating ``--rounds`` times (A B B A ...) so that a
changing machine load hits both alike. Per run: user and system CPU seconds, minor page faults and peak
resident memory of the command (``wait4``), and the layers' bridge losses, which must be the same bits.
``--full`` then times the sweep's default protocol on the same backbone (every layer, 200 steps) once.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SweepRun, report, run_sweep, table, target  # noqa: E402

MODES = ("glibc", "tuned")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="tiny-qwen3-16l", help="shipped backbone name or checkpoint directory")
    parser.add_argument("--layers", default="1 8 15", help="candidate layers of the short sweeps")
    parser.add_argument("--budget-steps", type=int, default=20, help="bridge steps per layer of the short sweeps")
    parser.add_argument("--rounds", type=int, default=2, help="runs per allocator setting (alternating)")
    parser.add_argument("--threads", default="1", help="DIHAL_NUM_THREADS of the short sweeps")
    parser.add_argument("--full", action="store_true", help="also time the default sweep once (tuned, auto threads)")
    args = parser.parse_args()
    if args.budget_steps < 1 or args.rounds < 1:
        parser.error("--budget-steps and --rounds must be >= 1")

    sweep_args = ["--model", args.model, "--layers", *args.layers.split(), "--budget-steps", str(args.budget_steps)]
    sweep_args += ["--score-repeats", "3"]
    runs: dict[str, list[SweepRun]] = {mode: [] for mode in MODES}
    order = [MODES[(i + i // 2) % 2] for i in range(2 * args.rounds)]  # glibc tuned tuned glibc ...
    with tempfile.TemporaryDirectory() as tmp:
        for i, mode in enumerate(order):
            runs[mode].append(
                run_sweep(sweep_args, Path(tmp) / f"{i}_{mode}", DIHAL_MALLOC=mode, DIHAL_NUM_THREADS=args.threads)
            )
            print(mode, runs[mode][-1], flush=True)
        full = None
        if args.full:
            full = run_sweep(
                ["--model", args.model], Path(tmp) / "full", DIHAL_MALLOC="tuned", DIHAL_NUM_THREADS="auto"
            )
            print("full", full, flush=True)

    layer_steps = len(args.layers.split()) * args.budget_steps

    def mean(mode: str, field: str) -> float:
        return sum(getattr(r, field) for r in runs[mode]) / len(runs[mode])

    rows = [
        [
            mode,
            mean(mode, "user_s"),
            mean(mode, "sys_s"),
            mean(mode, "sys_s") / (mean(mode, "user_s") + mean(mode, "sys_s")),
            mean(mode, "minor_faults") / layer_steps,
            max(r.max_rss_mb for r in runs[mode]),
            mean(mode, "wall_s"),
        ]
        for mode in MODES
    ]
    cpu = {mode: mean(mode, "user_s") + mean(mode, "sys_s") for mode in MODES}
    same = all(r.losses == runs["glibc"][0].losses for mode in MODES for r in runs[mode])
    body = (
        f"`dihal sweep --model {args.model} --layers {args.layers} --budget-steps {args.budget_steps} "
        f"--score-repeats 3`, DIHAL_NUM_THREADS={args.threads}, {args.rounds} run(s) per setting, alternating "
        "(means; peak memory the largest):\n\n"
        + table(
            ["DIHAL_MALLOC", "user s", "sys s", "sys share", "minor faults / layer-step", "peak RSS MB", "wall s"],
            rows,
        )
        + f"\n\nCPU time tuned / glibc: {cpu['tuned'] / cpu['glibc']:.2f}; bridge losses "
        + ("identical in every run." if same else "DIFFER between runs.")
    )
    figures: dict[str, object] = {
        "runs": {mode: [vars(r) for r in runs[mode]] for mode in MODES},
        "cpu_ratio_tuned_over_glibc": cpu["tuned"] / cpu["glibc"],
        "sys_share": {mode: row[3] for mode, row in zip(MODES, rows)},
    }
    targets = [
        target("the same bridge losses with either allocator setting", "identical" if same else "differ", same),
        target(
            "less CPU time with the tuned allocator", f"{cpu['tuned'] / cpu['glibc']:.2f}x", cpu["tuned"] < cpu["glibc"]
        ),
    ]
    if full is not None:
        full_cpu = full.user_s + full.sys_s
        body += (
            f"\n\nThe default sweep, `dihal sweep --model {args.model}` (every layer, the default budget; tuned "
            f"allocator, threads auto): {full.wall_s / 60:.1f} wall minutes, {full_cpu / 60:.1f} CPU minutes, peak "
            f"RSS {full.max_rss_mb:.0f} MB (load average {os.getloadavg()[0]:.1f} at the end)."
        )
        figures["full_sweep"] = vars(full)
        targets.append(target("the default sweep runs in minutes", f"{full.wall_s / 60:.1f} wall min", None))
    report(
        f"Allocator setting of the dihal command on CPU training ({Path(args.model).name}, bench_allocator.py)",
        body,
        question="allocator",
        figures=figures,
        targets=targets,
    )


if __name__ == "__main__":
    main()
