"""``dihal locate``: a thin shell over :func:`dihal_fast.pipeline.locate` (flags from ``LocateConfig``)."""

from __future__ import annotations

import argparse

from dihal_fast.common.options import HelpFormatter, add_dataclass_options, dataclass_from_options

EXIT_STOPPED = 3  # --max-batches stopped the pass; rerun with --resume


def register(subparsers: argparse._SubParsersAction) -> None:
    from dihal_fast.pipeline import LocateConfig

    parser = subparsers.add_parser(
        "locate",
        help="measure the geometry proxies at every layer and select the insertion layer l*",
        description=(
            "Run a causal LM over a corpus (one forward pass per batch, every hidden state streamed into an "
            "exact covariance and a uniform token sample per layer), estimate m_curv, m_mono and k_eff per "
            "layer on repeated subsamples, z-score them into the selection score and pick l* = argmax. "
            "Writes RUN/locate.json and RUN/geometry.png; checkpoints in RUN/collect. Multi-process: "
            "torchrun --nproc_per_node N $(which dihal) locate ..."
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--out", required=True, metavar="RUN", help="run directory for the report, the plot and the checkpoints"
    )
    add_dataclass_options(parser, LocateConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dihal_fast.pipeline import LocateConfig, locate

    report = locate(dataclass_from_options(LocateConfig, args), args.out)
    if not report.complete:
        return EXIT_STOPPED
    if report:  # rank 0 of a multi-process run
        print(
            f"selected layer {report.selected_layer}  (report: {report.out / 'locate.json'}, "
            f"plot: {report.out / 'geometry.png'})"
        )
    return 0
