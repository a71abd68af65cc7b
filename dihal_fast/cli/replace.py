"""``dihal replace`` (alias ``dihal train``): train the diffusion bridge for layer l* and export the hybrid."""
from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    from dihal_fast.train.config import add_config_arguments

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
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", default=None, help="local Hugging Face causal-LM checkpoint (default: the shipped backbone, or locate.json's model with --from-locate)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--layer", type=int, help="hidden state l* to rebuild (1..L-1); layers 1..l* are replaced")
    where.add_argument("--from-locate", metavar="RUN", help="take l* from RUN/locate.json (selected_layer) written by dihal locate")
    parser.add_argument("--corpus", nargs="+", default=None, help=".txt / .jsonl files, directories of them or a saved dataset (default: the shipped corpus)")
    parser.add_argument("--val-corpus", default=None, help="held-out corpus for validation (default: the tail of --corpus)")
    parser.add_argument("--out", required=True, help="run directory (configs, log, checkpoints, validation.json, hybrid/)")
    parser.add_argument("--deepspeed", metavar="CFG", default=None, help="DeepSpeed JSON config (ZeRO stage 0-3, bf16); see examples/ds_*.json")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    add_config_arguments(parser)
    parser.set_defaults(func=run)


def _from_locate(run: str) -> tuple[int, str | None]:
    from dihal_fast.common import read_json

    report = read_json(Path(run) / "locate.json", "locate report (dihal locate --out RUN)")
    layer = report.get("selected_layer") if isinstance(report, dict) else None
    if not isinstance(layer, int):
        raise ValueError(f"{Path(run) / 'locate.json'} has no integer 'selected_layer'")
    return layer, report.get("model")


def run(args: argparse.Namespace) -> int:
    from dihal_fast.common.rundir import run_directory
    from dihal_fast.train import train_bridge
    from dihal_fast.train.config import config_from_args

    config = config_from_args(args)
    layer, model = args.layer, args.model
    if args.from_locate is not None:
        layer, located_model = _from_locate(args.from_locate)
        if model is None:
            model = located_model
        elif located_model and Path(model).resolve() != Path(located_model).resolve():
            logger.warning("--model %s differs from the model %s that dihal locate measured", model, located_model)
        logger.info("layer %d from %s", layer, Path(args.from_locate) / "locate.json")
    corpus = args.corpus
    if corpus is None:
        from dihal_fast.backbone import default_corpus

        corpus = default_corpus()
    with run_directory(args.out, "dihal replace"):
        result = train_bridge(model, layer, corpus, args.out, config, deepspeed_config=args.deepspeed,
                              resume=args.resume, val_corpus=args.val_corpus)
    if int(os.environ.get("RANK", "0")) == 0:
        validation = result["validation"]
        print(json.dumps({k: validation[k] for k in ("layer", "bridge_loss", "hybrid_ppl", "backbone_ppl", "kl")}))
        print(f"hybrid written to {result['hybrid_dir']}")
    return 0
