"""``dihal sweep``: a thin shell over :func:`dihal_fast.pipeline.sweep` (flags from ``SweepConfig``)."""

from __future__ import annotations

import argparse

from dihal_fast.common.options import HelpFormatter, add_dataclass_options, dataclass_from_options


def register(subparsers: argparse._SubParsersAction) -> None:
    from dihal_fast.pipeline import SweepConfig

    parser = subparsers.add_parser(
        "sweep",
        help="train a fixed-budget bridge per layer and correlate the geometry score with the bridge loss",
        description="Run `dihal locate` with repeated score runs, train a bridge for every candidate layer with the "
        "same budget, take each one's validation bridge loss, and report Spearman, Kendall and Pearson correlations "
        "between the score and -bridge loss (mean +- std over the score runs), the rank gap between the best-scoring "
        "and the lowest-loss layer, and a plot. Writes RUN/sweep.json and RUN/sweep.png; reruns reuse finished layers.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--out", required=True, help="run directory")
    add_dataclass_options(parser, SweepConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dihal_fast.pipeline import SweepConfig, sweep

    report = sweep(dataclass_from_options(SweepConfig, args), args.out)
    print(f"{'layer':>5} {'score':>9} {'bridge loss':>12}")
    for row in report["layers"]:
        print(f"{row['layer']:>5} {row['score']:>9.3f} {row['bridge_loss']:>12.4f}")
    for name in ("spearman", "kendall", "pearson"):
        cell = report[name]
        std = "" if cell["std"] is None else f" +- {cell['std']:.4f}"
        print(f"{name}: {cell['mean']:.4f}{std}" if cell["mean"] is not None else f"{name}: undefined (constant input)")
    print(
        f"rank gap: {report['rank_gap']} (selected layer {report['predicted_layer']}, lowest loss "
        f"{report['observed_best_layer']}); report: {args.out}/sweep.json, plot: {args.out}/sweep.png"
    )
    return 0
