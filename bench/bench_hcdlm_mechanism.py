"""Does HC-DLM's hierarchy carry the solution? `dihal hcdlm eval --compare` on a finished run, as a record.

Question (the paper's Fig. 3a/3b and the input probes): on the same fresh Sudoku test puzzles as
``bench_hcdlm`` (generated easy + hard, generator seed ``--eval-seed``), how does the decoded answer evolve per
normalised sampling step for HC-DLM and for ``--compare`` (MDM), how does final accuracy change with the number
of steps, and what happens to HC-DLM's one-step read-out when x_t is replaced by noise, or the scaffold by the
true or by random tokens? The puzzles are written as a CSV and scored through
:func:`dihal_fast.hcdlm.evaluate_run`, the library call behind ``dihal hcdlm eval``.

    python bench/bench_hcdlm_mechanism.py RUN --compare MDM_RUN --out DIR
"""

from __future__ import annotations

import argparse
import csv
import logging
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report, rows_figure, table, target  # noqa: E402

from dihal_fast.hcdlm import evaluate_run  # noqa: E402
from dihal_fast.hcdlm.config import SampleConfig  # noqa: E402
from dihal_fast.hcdlm.eval_config import HCDLMEvalConfig  # noqa: E402
from dihal_fast.hcdlm.eval_data import generated_sudoku  # noqa: E402
from dihal_fast.hcdlm.scoring import load_run  # noqa: E402
from dihal_fast.tasks.sudoku import format_grid  # noqa: E402

LEVELS = (0.05, 0.25, 0.5, 0.75, 0.95)
FRACTIONS = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("run", type=Path, help="the HC-DLM run directory")
    p.add_argument("--compare", type=Path, required=True, help="the baseline run (MDM) on the same task")
    p.add_argument("--out", type=Path, required=True, help="folder for the puzzles CSV, the JSON report and plots")
    p.add_argument("--n", type=int, default=150, help="test puzzles per group (generated easy, hard)")
    p.add_argument("--eval-seed", type=int, default=123, help="generator seed of the test puzzles (bench_hcdlm's)")
    p.add_argument("--steps", type=int, default=50, help="sampling steps of the main evaluation and trajectories")
    p.add_argument("--steps-sweep", default="10,25,50,100", help="step counts of the accuracy-vs-steps curve")
    p.add_argument("--clamp", action="store_true", help="HC-DLM: the clamp sampler setting (as chosen on validation)")
    p.add_argument("--question", default="hcdlm_mechanism9", help="bench/results/ record to write")
    return p.parse_args()


def write_puzzles(run_dir: Path, n: int, seed: int, path: Path) -> Path:
    """The generated easy + hard test puzzles of ``bench_hcdlm`` as a CSV (puzzle, solution, level)."""
    task = load_run(run_dir, device="cpu").task
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["puzzle", "solution", "level"])
        for split in ("easy", "hard"):
            for ex in generated_sudoku(task, split, n, seed=seed):
                puzzle, solution = ex.payload
                writer.writerow([format_grid(puzzle), format_grid(solution), split])
    return path


def at_fraction(trajectory: list[dict], fraction: float, key: str) -> float:
    """``key`` (%) of the first trajectory row at or after normalised step ``fraction``."""
    return round(100 * next(row[key] for row in trajectory if row["fraction"] >= fraction - 1e-9), 1)


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    data = write_puzzles(args.run, args.n, args.eval_seed, args.out / f"puzzles_seed{args.eval_seed}.csv")
    sample = SampleConfig(steps=args.steps, clamp=args.clamp, temperature=0.0, batch_size=150)
    config = HCDLMEvalConfig(
        run_dir=str(args.run),
        data=str(data),
        sample=sample,
        steps_sweep=[int(s) for s in args.steps_sweep.split(",") if s],
        compare=str(args.compare),
        noise_levels=list(LEVELS),
        device="cpu",
    )
    result = evaluate_run(config, args.out / "mechanism.json")
    key = "blank_cells"
    ablations = result["oracle_ablations"]
    ablation_rows = [
        [row["s"]]
        + [round(100 * row[name][key], 1) for name in ("model", "x_t_noise", "scaffold_true", "scaffold_random")]
        for row in ablations
    ]
    low = [row for row in ablations if row["s"] <= 0.5]
    noise_cost = max(100 * (row["model"][key] - row["x_t_noise"][key]) for row in low)
    scaffold_gap = max(100 * (row["scaffold_true"][key] - row["scaffold_random"][key]) for row in ablations)
    names = {label: traj for label, traj in result["trajectory"].items()}
    trajectory_rows = [
        [label] + [f"{at_fraction(t, f, 'accuracy')} / {at_fraction(t, f, key)}" for f in FRACTIONS]
        for label, t in names.items()
    ]
    curves = {
        "HC-DLM": result["accuracy_vs_steps"],
        result["compare"]["model"].upper(): result["compare"]["accuracy_vs_steps"],
    }
    steps = [row["steps"] for row in curves["HC-DLM"]]
    curve_rows = [
        [label]
        + [
            f"{100 * row['groups']['easy']['accuracy']:.1f} / {100 * row['groups']['hard']['accuracy']:.1f}"
            for row in curve
        ]
        for label, curve in curves.items()
    ]
    ablation_header = ["s", "model inputs", "x_t -> noise", "scaffold -> true", "scaffold -> random"]
    trajectory_header = ["model"] + [f"step {f:g}" for f in FRACTIONS]
    curve_header = ["model"] + [str(s) for s in steps]
    body = (
        f"HC-DLM `{args.run}` (step {result['step']}) against `{args.compare}` (step {result['compare']['step']}) on "
        f"{args.n} easy + {args.n} hard generated test puzzles (seed {args.eval_seed}), EMA weights, argmax, "
        f"{args.steps} steps, clamp {'on' if args.clamp else 'off'}; report `{args.out / 'mechanism.json'}`, plots "
        "beside it.\n\nOne-step read-out, blank cells % (x_0 = the encoder mean of the true tokens, noised to the "
        f"latent's level s ** {load_run(args.run, device='cpu').config.model.latent_schedule_power:g}):\n\n"
        + table(ablation_header, ablation_rows)
        + "\n\nDecoded answer per normalised sampling step, boards / blank cells % (easy + hard):\n\n"
        + table(trajectory_header, trajectory_rows)
        + "\n\nBoards solved (easy / hard %) against sampling steps:\n\n"
        + table(curve_header, curve_rows)
    )
    report(
        "HC-DLM mechanism on Sudoku: latent and scaffold ablations, trajectory, steps",
        body,
        question=args.question,
        figures={
            "ablations_blank_cells": rows_figure(ablation_header, ablation_rows),
            "trajectory": rows_figure(trajectory_header, trajectory_rows),
            "accuracy_vs_steps": rows_figure(curve_header, curve_rows),
            "x_t_noise_cost_points": round(noise_cost, 1),
            "true_minus_random_scaffold_points": round(scaffold_gap, 1),
        },
        targets=[
            target(
                "x_t -> noise costs >= 10 points of blank cells at some s <= 0.5", f"{noise_cost:.1f}", noise_cost >= 10
            ),
            target("a true scaffold beats a random one by >= 10 points", f"{scaffold_gap:.1f}", scaffold_gap >= 10),
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
