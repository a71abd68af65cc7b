"""Sudoku accuracy against training budget: one table from several ``bench_hcdlm`` results, as a record.

Question: do HC-DLM and MDM cross, and where, as the CPU budget grows? Each budget point is a
``bench_hcdlm.py`` output folder (its ``sudoku_results.json``; the runs are trained with ``--minutes M``, a
longer point by resuming a copy of the shorter run's folder with a larger ``--minutes``, which continues the
same trajectory: the learning rate is constant after the warm-up). A point may list several folders; each
model is taken from the first folder that has it.

    python bench/bench_hcdlm_budget.py --point 10=RUNS10 --point 30=RUNS30A,RUNS30B --point 60=RUNS60 \\
        --question hcdlm_sudoku9_budget
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_tables, report, table  # noqa: E402
from bench_hcdlm import LABELS  # noqa: E402


def parse_point(text: str) -> tuple[float, list[Path]]:
    """``"30=DIR_A,DIR_B"`` -> ``(30.0, [DIR_A, DIR_B])``."""
    minutes, sep, folders = text.partition("=")
    if not sep or not folders:
        raise argparse.ArgumentTypeError(f"--point {text!r}: expected MINUTES=DIR[,DIR...]")
    try:
        value = float(minutes)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--point {text!r}: {minutes!r} is not a number of minutes") from None
    return value, [Path(f) for f in folders.split(",")]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--point",
        type=parse_point,
        action="append",
        required=True,
        metavar="MINUTES=DIR[,DIR...]",
        help="a budget and the bench_hcdlm output folders trained for it",
    )
    p.add_argument("--models", default="hcdlm,mdm", help="models of the table, in this order")
    p.add_argument("--question", required=True, help="bench/results/ record to write")
    p.add_argument("--title", default="HC-DLM vs MDM against training budget", help="the record's title")
    p.add_argument("--note", default="", help="a sentence on how the runs were trained, appended to the table")
    return p.parse_args()


def load_point(folders: list[Path], models: list[str]) -> dict[str, dict]:
    """Each model's result at one budget: from the first folder whose results hold it."""
    found: dict[str, dict] = {}
    for folder in folders:
        path = folder / "sudoku_results.json"
        if not path.is_file():
            raise SystemExit(f"{path}: no bench_hcdlm results there (evaluate the runs first)")
        for model, result in json.loads(path.read_text(encoding="utf-8"))["models"].items():
            found.setdefault(model, result)
    missing = [m for m in models if m not in found]
    if missing:
        raise SystemExit(f"{', '.join(map(str, folders))}: no results for {', '.join(missing)}")
    return {m: found[m] for m in models}


def main() -> int:
    args = parse_args()
    models = [m for m in args.models.split(",") if m]
    points = sorted(args.point)
    budgets = [minutes for minutes, _ in points]
    if len(set(budgets)) != len(budgets):
        raise SystemExit(f"--point: each budget once, got {', '.join(f'{m:g}' for m in budgets)}")
    results = {minutes: load_point(folders, models) for minutes, folders in points}
    groups = list(next(iter(results[points[0][0]].values()))["groups"])
    header = ["budget (CPU min)", "model", "train steps", "sampler (chosen on validation)"]
    header += [f"{g} acc %" for g in groups] + [f"{g} blank cells %" for g in groups[:2]]
    rows = []
    for minutes, per_model in results.items():
        for model, r in per_model.items():
            run = r["runs"][0]
            chosen = ", ".join(f"{k}={v}" for k, v in run["chosen"].items())
            rows.append(
                [f"{minutes:g}", LABELS[model], run["train"]["step"], chosen]
                + [round(100 * run["groups"][g]["accuracy"], 1) for g in groups]
                + [round(100 * run["groups"][g]["blank_cells"], 1) for g in groups[:2]]
            )
    gap = [
        [f"{minutes:g}"]
        + [
            round(100 * (per_model["hcdlm"]["groups"][g]["accuracy"] - per_model["mdm"]["groups"][g]["accuracy"]), 1)
            for g in groups[:2]
        ]
        for minutes, per_model in results.items()
        if {"hcdlm", "mdm"} <= per_model.keys()
    ]
    body = table(header, rows)
    if gap:
        body += "\n\nHC-DLM minus MDM, points of boards solved:\n\n" + table(["budget"] + groups[:2], gap)
    sources = "; ".join(f"{minutes:g} min: {', '.join(f'`{f}`' for f in folders)}" for minutes, folders in points)
    body += f"\n\nRuns (bench_hcdlm output folders): {sources}. {args.note}".rstrip()
    report(args.title, body, question=args.question, figures={"tables": markdown_tables(body)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
