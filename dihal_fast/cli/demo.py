"""``dihal demo``: a thin shell over :func:`dihal_fast.pipeline.demo` (flags from ``DemoConfig``)."""

from __future__ import annotations

import argparse

from dihal_fast.common.options import HelpFormatter, add_dataclass_options, dataclass_from_options
from dihal_fast.errors import DihalValueError


def register(subparsers: argparse._SubParsersAction) -> None:
    from dihal_fast.pipeline import DemoConfig

    parser = subparsers.add_parser(
        "demo",
        help="locate -> replace -> evaluate -> generate on the shipped backbone, with report.md",
        description="The whole DiHAL pipeline on the shipped backbone and its default corpus (or your own): pick the "
        "insertion layer from the geometry, train a bridge there, evaluate the hybrid against the backbone and a "
        "Diffusion-LM-like control, sample from it, and write RUN/report.md (tables, plots), RUN/report.json and "
        "RUN/samples.json. About 15 minutes on 2 CPU cores with the defaults; rerunning resumes finished stages.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--out", default="dihal_demo", help="run directory")
    add_dataclass_options(parser, DemoConfig)
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (0 = the cores other processes leave free, re-checked while it runs)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dihal_fast.pipeline import DemoConfig, demo

    if args.threads < 0:
        raise DihalValueError(f"--threads must be >= 0, got {args.threads}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    summary = demo(dataclass_from_options(DemoConfig, args), args.out)
    t = summary["targets"]
    print(
        f"selected layer {summary['selected_layer']}; hybrid/backbone PPL {t['ppl_ratio']:.3f} "
        f"(target <= 1.25: {'met' if t['ppl_ratio_met'] else 'missed'}); tokens/s ratio {t['tokens_per_s_ratio']:.3f}"
    )
    print(f"report: {args.out}/report.md")
    return 0
