"""``dihal evaluate``: a thin shell over :func:`dihal_fast.pipeline.evaluate` (flags from ``EvaluateConfig``)."""

from __future__ import annotations

import argparse

from dihal_fast.common.options import HelpFormatter, add_dataclass_options, dataclass_from_options


def register(subparsers: argparse._SubParsersAction) -> None:
    from dihal_fast.pipeline import EvaluateConfig

    parser = subparsers.add_parser(
        "evaluate",
        help="NLL, PPL, KL, Gen PPL, entropy, diversity and speed of a hybrid against its backbone",
        description="Score a hybrid and its backbone on the held-out tail of a corpus (token-pooled NLL/PPL, "
        "KL(backbone || hybrid)), sample from both (Gen PPL under an evaluator LM, unigram entropy, DiHAL and LD4LG "
        "diversity, tokens/s), optionally with controls: the oracle and worst layers of a `dihal sweep` run and a "
        "Diffusion-LM-like embedding-space baseline with the same training budget, and with --tasks "
        "lm-evaluation-harness tasks on every scored model (offline: dihal_lambada_local,dihal_cloze_local; needs "
        "dihal_fast[lm_eval]). Writes RUN/evaluate.json "
        "(resumable: finished sections in RUN/sections are reused).",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--out", required=True, help="run directory for evaluate.json")
    add_dataclass_options(parser, EvaluateConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dihal_fast.evaluate.markdown import METRICS, downstream_table, metric_cell
    from dihal_fast.pipeline import EvaluateConfig, evaluate

    report = evaluate(dataclass_from_options(EvaluateConfig, args), args.out)
    columns = {"backbone": report["backbone"], "hybrid": report["hybrid"], **report["controls"]}
    print("metric".ljust(16) + "".join(name.rjust(24) for name in columns))
    for metric in METRICS:
        cells = [metric_cell(col, metric) for col in columns.values()]
        print(metric.ljust(16) + "".join(c.rjust(24) for c in cells))
    if report.get("downstream"):
        print("\n" + downstream_table(report))
    print(f"report: {args.out}/evaluate.json")
    return 0
