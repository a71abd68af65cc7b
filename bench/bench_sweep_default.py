"""How long the sweep's default protocol takes on a shipped backbone, as a user runs it.

``dihal sweep --model M --out RUN`` with every default (every candidate layer, 200 bridge steps per layer, 30
score runs, ``--workers`` and threads chosen by the command): wall time, CPU time of the command and its
workers, peak memory of the largest process, the Spearman correlation, and whether the layers' bridge losses
equal those of the layer-table record of the same backbone (``bench/results/layer_tables_*.json``, 4
significant digits there). The load average is recorded: wall time means something only on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, report, run_sweep, table, target  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="tiny-qwen3-16l", help="shipped backbone name")
    parser.add_argument("--minutes-target", type=float, default=20.0, help="wall minutes the run should stay within")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        run = run_sweep(["--model", args.model], Path(tmp) / "sweep")
        sweep = json.loads((Path(tmp) / "sweep" / "sweep.json").read_text())
    tables = RESULTS_DIR / f"layer_tables_{args.model.replace('-', '_')}.json"
    recorded = {}
    if tables.is_file():
        rows = json.loads(tables.read_text())["figures"]["sweep_layers"]
        column = rows["columns"].index("bridge loss")
        recorded = {str(row[0]): row[column] for row in rows["rows"]}
    same = bool(recorded) and all(float(f"{run.losses[k]:.4g}") == v for k, v in recorded.items())
    cpu = run.user_s + run.sys_s
    body = (
        f"`dihal sweep --model {args.model} --out RUN` (every default; {len(run.losses)} layers), load average "
        f"{load_before:.1f} before and {os.getloadavg()[0]:.1f} after:\n\n"
        + table(
            ["wall min", "CPU min", "peak RSS MB (largest process)", "Spearman (mean)"],
            [[run.wall_s / 60, cpu / 60, run.max_rss_mb, sweep["spearman"]["mean"]]],
        )
        + "\n\nBridge losses against the layer-table record: "
        + ("equal to its 4 significant digits." if same else "not equal (or no record)." if recorded else "no record.")
    )
    report(
        f"The sweep's default protocol on {args.model}, as a user runs it (bench_sweep_default.py)",
        body,
        question="sweep_default",
        figures={"run": vars(run), "spearman": sweep["spearman"], "load_before": load_before},
        targets=[
            target(
                f"the default sweep within {args.minutes_target:g} wall minutes",
                f"{run.wall_s / 60:.1f} min",
                run.wall_s / 60 <= args.minutes_target,
            ),
            target("the bridge losses of the layer-table record", "equal" if same else "differ", same),
        ],
    )


if __name__ == "__main__":
    main()
