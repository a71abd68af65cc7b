"""Sudoku accuracy against best-of-K on the test split: HC-DLM's K chains against MDM's, with the sampling cost.

Question: how does accuracy grow when K chains per puzzle are sampled and the one whose answer the model
itself finds most likely is kept (``--best-of K``), for HC-DLM (its chains differ at argmax: random scaffold
re-noising and x_T) and for MDM (its K > 1 chains drawn at ``--compare-temperature``; at argmax they are one), and
what does it cost in sampling passes and CPU seconds? Test-time scaling along K, beside bench_hcdlm's steps.

    python bench/bench_hcdlm_best_of.py RUNS/sudoku/hcdlm --compare RUNS/sudoku/mdm --eval-seed 20261202 \\
        --k 1,2,4,8 --question hcdlm_best_of_scaling
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report, rows_figure, table  # noqa: E402
from bench_hcdlm import LABELS, eval_examples, int_list  # noqa: E402

from dihal_fast.hcdlm.config import SampleConfig  # noqa: E402
from dihal_fast.hcdlm.plots import save_lines  # noqa: E402
from dihal_fast.hcdlm.scoring import evaluate_examples, load_run  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("run", type=Path, help="the HC-DLM run directory")
    p.add_argument("--compare", type=Path, default=None, help="an MDM (or other) run on the same task")
    p.add_argument("--k", default="1,2,4,8", help="best-of-K values, comma-separated")
    p.add_argument("--steps", type=int, default=50, help="sampling steps per chain (the paper's 50)")
    p.add_argument(
        "--compare-temperature", type=float, default=1.0, help="the compared run's token temperature for K > 1"
    )
    p.add_argument("--eval-n", type=int, default=300, help="test puzzles per group (as bench_hcdlm)")
    p.add_argument("--eval-seed", type=int, default=123, help="generator seed of the test puzzles (as bench_hcdlm)")
    p.add_argument(
        "--val-n", type=int, default=150, help="bench_hcdlm's validation size (the Kaggle windows follow it)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--question", default="hcdlm_best_of_scaling", help="bench/results/ record to write")
    return p.parse_args()


def scaling_rows(run, examples: list, ks: list[int], steps: int, temperature: float) -> list[dict]:
    """Accuracy per group, blank cells and process CPU seconds per puzzle for each K (K = 1 at argmax)."""
    rows = []
    for k in ks:
        cfg = SampleConfig(steps=steps, batch_size=100, best_of=k, temperature=temperature if k > 1 else 0.0)
        began = time.process_time()
        result = evaluate_examples(run, examples, cfg, show=0)
        seconds = (time.process_time() - began) / len(examples)
        groups = {g: round(100 * v["accuracy"], 1) for g, v in result["groups"].items()}
        rows.append(
            {
                "k": k,
                "temperature": cfg.temperature,
                "passes": k * steps,
                "groups": groups,
                "blank_cells": round(100 * result["blank_cells"], 1),
                "cpu_s_per_puzzle": round(seconds, 4),
            }
        )
        print(f"{run.config.model.kind} K={k}: {groups} ({seconds:.3f} CPU s per puzzle)", flush=True)
    return rows


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    runs = {"hcdlm": load_run(args.run)}
    if args.compare is not None:
        compared = load_run(args.compare)
        runs[compared.config.model.kind] = compared
    for name, run in runs.items():
        if run.config.task.name != "sudoku":
            raise SystemExit(f"{name}: a Sudoku run is needed, got {run.config.task.name}")
    ks = int_list(args.k)
    examples = eval_examples("sudoku", runs["hcdlm"], args)
    results = {
        name: scaling_rows(run, examples, ks, args.steps, 0.0 if name == "hcdlm" else args.compare_temperature)
        for name, run in runs.items()
    }
    groups = list(results["hcdlm"][0]["groups"])
    header = ["model", "K", "temperature", "passes per puzzle", *[f"{g} %" for g in groups], "blank cells %"]
    header.append("CPU s per puzzle")
    body_rows = [
        [LABELS.get(name, name), r["k"], r["temperature"], r["passes"], *r["groups"].values(), r["blank_cells"]]
        + [r["cpu_s_per_puzzle"]]
        for name, rows in results.items()
        for r in rows
    ]
    series = {
        f"{LABELS.get(name, name)}, {g}": ([r["passes"] for r in rows], [r["groups"][g] for r in rows])
        for name, rows in results.items()
        for g in groups[:2]
    }
    plot = save_lines(
        series,
        Path(__file__).resolve().parent / "results" / f"{args.question}.png",
        "sampling passes per puzzle (K x steps)",
        "boards solved (%)",
        f"best-of-K at {args.steps} steps",
        log_x=True,
    )
    board = runs["hcdlm"].task.geo.n
    body = (
        table(header, body_rows)
        + f"\n\n{board}x{board} test puzzles ({args.eval_n} per group, generator seed {args.eval_seed}); {args.steps} "
        f"sampling steps per chain; K chains per puzzle in one batch, the answer is the chain with the highest "
        f"log-probability of its own tokens; HC-DLM at argmax, the compared run at argmax for K = 1 and at "
        f"temperature {args.compare_temperature} for K > 1. CPU seconds: process time on {args.threads} thread(s). "
        f"Runs: {args.run}" + (f", {args.compare}" if args.compare else "") + f". Plot: bench/results/{plot.name}."
    )
    figures = {
        name: rows_figure(
            ["k", "passes", *groups, "blank_cells", "cpu_s_per_puzzle"],
            [[r["k"], r["passes"], *r["groups"].values(), r["blank_cells"], r["cpu_s_per_puzzle"]] for r in rows],
        )
        for name, rows in results.items()
    }
    report(
        "Sudoku accuracy against best-of-K chains: HC-DLM and MDM, test split",
        body,
        question=args.question,
        figures=figures,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
