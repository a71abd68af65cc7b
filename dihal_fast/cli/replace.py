"""``dihal replace`` (alias ``dihal train``): a thin shell over :func:`dihal_fast.pipeline.replace` (flags from
``ReplaceConfig`` and its ``BridgeTrainConfig``)."""

from __future__ import annotations

import argparse
import json
import sys

from dihal_fast.common.launch import launcher_env
from dihal_fast.common.options import HelpFormatter, add_dataclass_options, dataclass_from_options


def register(subparsers: argparse._SubParsersAction) -> None:
    from dihal_fast.pipeline import ReplaceConfig

    parser = subparsers.add_parser(
        "replace",
        aliases=["train"],
        help="replace layers 1..l* by a diffusion bridge and train it (writes a HybridLM directory)",
        description=(
            "Train a conditional diffusion bridge that rebuilds hidden state h_l* from the embedding output, "
            "distilled from the frozen backbone (L_diff + L_rec + L_LM + L_KD), and export RUN/hybrid "
            "(HybridLM.from_pretrained). Checkpoints in RUN/checkpoints; --resume continues. Several "
            "processes with DeepSpeed ZeRO: torchrun --nproc_per_node N $(which dihal) replace --deepspeed CFG ..."
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--out", required=True, help="run directory (configs, log, checkpoints, validation.json, hybrid/)"
    )
    add_dataclass_options(parser, ReplaceConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dihal_fast.pipeline import ReplaceConfig, replace

    report = replace(dataclass_from_options(ReplaceConfig, args), args.out)
    if launcher_env().rank == 0:
        validation = report["validation"]
        print(json.dumps({k: validation[k] for k in ("layer", "bridge_loss", "hybrid_ppl", "backbone_ppl", "kl")}))
        print(f"hybrid written to {report.hybrid_dir}", file=sys.stderr)  # stdout is the JSON line alone
    return 0
