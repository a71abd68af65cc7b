"""One HC-DLM training variant on Sudoku (6x6; ``--bench-args`` for 9x9): train for a CPU budget, score it on the
validation split.

Question: which objective / architecture choice makes HC-DLM learn at CPU scale? Each call trains the
benchmark's configuration (``bench_hcdlm.run_config``) with ``--set section.field=value`` overrides and
scores EMA and raw weights, with and without clamping, on the validation puzzles of ``bench_hcdlm``
(never the test puzzles), plus the read-out accuracy after the first and the last sampling step, the
encoder's settled sigma on those puzzles, and the input ablations of :mod:`dihal_fast.hcdlm.mechanism`
(x_t -> noise, scaffold -> true / random tokens) at s = 0.05, 0.5, 0.95 (``--levels``); ``--quick`` scores the EMA
weights only (no raw / clamp rows), for CPU-starved comparisons. Every variant of ``--out``'s variants.jsonl (the
latest line per name) becomes the record
bench/results/hcdlm_variants.json.

    python bench/bench_hcdlm_variants.py exposure1 --minutes 5 --set objective.exposure_share=1.0
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_hcdlm  # noqa: E402
from _common import report, rows_figure, table  # noqa: E402

from dihal_fast.common.options import comma_floats  # noqa: E402
from dihal_fast.hcdlm.config import SampleConfig  # noqa: E402
from dihal_fast.hcdlm.mechanism import ablation_effects, ablation_readout, reference_targets  # noqa: E402
from dihal_fast.hcdlm.scoring import evaluate_examples, load_run, readout_by_step  # noqa: E402
from dihal_fast.hcdlm.trainer import train  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("name", help="variant name (run directory under --out)")
    p.add_argument("--model", default="hcdlm", help="a bench_hcdlm model name (hcdlm, hcdlm_absorbing, ...)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override of the run config, e.g. objective.exposure_share=1.0 or model.latent_dim=256 (JSON values)",
    )
    p.add_argument("--minutes", type=float, default=5.0, help="training budget (process CPU minutes, 1 thread)")
    p.add_argument("--val-n", type=int, default=150, help="validation puzzles per group (easy, hard)")
    p.add_argument("--out", type=Path, default=Path("runs/hcdlm_variants"), help="run directories and variants.jsonl")
    p.add_argument("--run-dir", type=Path, default=None, help="the variant's run directory (default: --out/NAME)")
    p.add_argument("--quick", action="store_true", help="score the EMA weights only (skip the raw and clamp rows)")
    p.add_argument(
        "--levels",
        type=comma_floats,
        default=[0.05, 0.5, 0.95],
        help="noise levels s of the input ablations, comma-separated",
    )
    p.add_argument(
        "--bench-args",
        default="",
        help="bench_hcdlm arguments that set the benchmark's configuration, e.g. '--sudoku-box 3x3 --lr 0.003 "
        "--eval-n 150' for 9x9 (default: its 6x6 one)",
    )
    p.add_argument(
        "--question",
        default="hcdlm_variants",
        help="bench/results/ record the variants of --out become (hcdlm_defaults: the choice of the 6x6 defaults)",
    )
    return p.parse_args()


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    defaults = argparse.Namespace(
        **{**vars(bench_defaults(shlex.split(args.bench_args))), "minutes": args.minutes, "val_n": args.val_n}
    )
    config = bench_hcdlm.override(bench_hcdlm.run_config("sudoku", args.model, defaults), args.set)
    run_dir = args.run_dir or args.out / args.name
    summary = train(config, run_dir)
    result = {"name": args.name, "model": args.model, "set": args.set, "minutes": args.minutes, "step": summary["step"]}
    run = load_run(run_dir, device="cpu")
    val = bench_hcdlm.eval_examples("sudoku", run, defaults, "validation")
    base = SampleConfig(steps=50, batch_size=200)
    settings = {"ema": (run, base)}
    if not args.quick:
        settings.update(
            {
                "raw": (load_run(run_dir, use_ema=False, device="cpu"), base),
                "ema_clamp": (run, replace(base, clamp=True)),
            }
        )
    for label, (weights, sample) in settings.items():
        groups = evaluate_examples(weights, val, sample, show=0)["groups"]
        result[label] = {
            g: {"boards": round(100 * v["accuracy"], 1), "blank_cells": round(100 * v["blank_cells"], 1)}
            for g, v in groups.items()
        }
    if hasattr(run.model, "denoiser"):
        rows = readout_by_step(run, val, base)
        result["readout_blank_cells_first_last"] = [
            round(100 * rows[0]["blank_cells"], 1),
            round(100 * rows[-1]["blank_cells"], 1),
        ]
        result["sigma"] = settled_sigma(run, val)
        ablations = ablation_readout(run, val, tuple(args.levels))
        result["ablation_blank_cells"] = {
            f"s={row['s']}": {k: round(100 * v["blank_cells"], 1) for k, v in row.items() if k != "s"}
            for row in ablations
        }
        result["ablation_effects"] = {
            k: round(100 * v, 1) for k, v in ablation_effects(ablations, "blank_cells").items()
        }
    print(json.dumps(result))
    args.out.mkdir(parents=True, exist_ok=True)  # absent when --run-dir puts the run elsewhere
    with (args.out / "variants.jsonl").open("a") as handle:
        handle.write(json.dumps(result) + "\n")
    report_variants(args.out / "variants.jsonl", args.question, board=f"{run.task.geo.n}x{run.task.geo.n}")
    return 0


def settled_sigma(run, examples: list) -> dict[str, float]:
    """The encoder's sigma = exp(logvar / 2) on the true answers of ``examples``: median, 5th and 95th percentile."""
    with torch.no_grad():
        context = torch.tensor([ex.context for ex in examples])
        logvar = run.model.encoder(reference_targets(run, examples), context)[1]
    sigma = (0.5 * logvar).exp().flatten()
    return {q: round(float(sigma.quantile(v)), 4) for q, v in (("p05", 0.05), ("median", 0.5), ("p95", 0.95))}


def report_variants(path: Path, question: str = "hcdlm_variants", board: str = "6x6") -> None:
    """Write the record of every variant in ``path`` (the latest line per name): boards and blank cells %."""
    latest = {r["name"]: r for r in map(json.loads, path.read_text().splitlines())}

    def pair(r: dict, label: str, key: str) -> str:
        return f"{r[label]['easy'][key]} / {r[label]['hard'][key]}" if label in r else "-"

    def pooled(r: dict) -> str:
        """Boards / blank cells % over every validation group (easy, hard and, on 9x9, the Kaggle levels), each of
        --val-n puzzles: the least noisy single figure of a variant."""
        groups = r["ema"].values()
        return " / ".join(f"{sum(g[key] for g in groups) / len(groups):.1f}" for key in ("boards", "blank_cells"))

    def effects(r: dict) -> str:
        e = r.get("ablation_effects")
        return "-" if e is None else f"{e['x_t_noise']} / {e['true_minus_random_scaffold']}"

    def latent_drops(r: dict) -> str:
        """The read-out's loss in blank cells when x_t becomes noise, at each ablation level."""
        cells = r.get("ablation_blank_cells", {})
        return " / ".join(f"{k[2:]}: {round(v['model'] - v['x_t_noise'], 1)}" for k, v in cells.items()) or "-"

    header = [
        "variant",
        "--set",
        "minutes",
        "steps",
        "easy / hard boards % (EMA)",
        "easy / hard blank cells % (EMA)",
        "all groups, boards / blank cells % (EMA)",
        "raw weights, boards %",
        "clamp, boards %",
        "sigma (median)",
        "x_t->noise / true-random scaffold, cells pts",
        "x_t->noise drop per s, cells pts",
    ]
    rows = [
        [
            r["name"],
            " ".join(r["set"]) or "-",
            r["minutes"],
            r["step"],
            pair(r, "ema", "boards"),
            pair(r, "ema", "blank_cells"),
            pooled(r),
            pair(r, "raw", "boards"),
            pair(r, "ema_clamp", "boards"),
            r.get("sigma", {}).get("median", "-"),
            effects(r),
            latent_drops(r),
        ]
        for r in latest.values()
    ]
    body = (
        table(header, rows) + f"\n\nValidation split of bench_hcdlm (never the test puzzles), 50 sampling steps, "
        f"argmax; variants of `{path}`."
    )
    report(
        f"HC-DLM objective variants on {board} Sudoku (validation puzzles only)",
        body,
        question=question,
        figures={"variants": rows_figure(header, rows), "results": list(latest.values())},
    )


def bench_defaults(extra: list[str] | None = None) -> argparse.Namespace:
    """bench_hcdlm's arguments: its defaults (the 6x6 benchmark), with ``extra`` given on its command line."""
    saved, sys.argv = sys.argv, [sys.argv[0], *(extra or [])]
    try:
        return bench_hcdlm.parse_args()
    finally:
        sys.argv = saved


if __name__ == "__main__":
    sys.exit(main())
