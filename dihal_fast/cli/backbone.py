"""``dihal backbone``: train a small causal LM (``train``), list the shipped ones (``list``) and describe a
checkpoint (``info``)."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys

from dihal_fast.backbone.config import BackboneTrainConfig
from dihal_fast.common.devices import DEVICE_HELP, device_argument
from dihal_fast.common.options import HelpFormatter, add_dataclass_options, dataclass_from_options
from dihal_fast.errors import DihalValueError
from dihal_fast.train.settings import DEEPSPEED_HELP

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "backbone",
        help="train, list or describe the small backbone LMs",
        description="Train a byte-level BPE tokenizer + Llama or Qwen3 causal LM on UTF-8 text, list the shipped "
        "backbones, or describe a checkpoint.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    actions = parser.add_subparsers(dest="backbone_command", metavar="ACTION", required=True)
    _register_train(actions)
    info = actions.add_parser(
        "info",
        help="architecture, parameters, training data and validation perplexity of a backbone",
        description="Describe a backbone directory or .gguf file (reads config.json and training_report.json).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    info.add_argument(
        "--model",
        default=None,
        help="shipped backbone name, checkpoint directory or .gguf file (default: the default shipped backbone)",
    )
    info.set_defaults(func=run_info)
    listing = actions.add_parser(
        "list",
        help="the shipped backbones (name, family, layers, width, parameters, held-out PPL)",
        description="The backbones shipped inside the package; pass a name as --model to any command.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    listing.add_argument("--json", action="store_true", help="print a JSON list of objects instead of a table")
    listing.set_defaults(func=run_list)


def _register_train(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser(
        "train",
        help="train a backbone (tokenizer + LlamaForCausalLM or Qwen3ForCausalLM) on text files",
        description="Train a byte-level BPE tokenizer (or reuse one: --tokenizer DIR) and a LlamaForCausalLM "
        "(--family llama) or Qwen3ForCausalLM (--family qwen3) on UTF-8 text files, with "
        "warmup + cosine LR, AdamW, gradient clipping, periodic validation, checkpoints and --resume. "
        "Held-out splits: --valid files, else the X.valid.txt next to every X.train.txt, else the tail of each file. "
        "Several processes with DeepSpeed ZeRO: torchrun --nproc_per_node N $(which dihal) backbone train --deepspeed "
        "CFG ...",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--out", required=True, help="run directory (model, tokenizer, log, report, resume state)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument(
        "--stop-at",
        type=int,
        default=None,
        help="end this invocation after this step with a checkpoint (continue with --resume)",
    )
    p.add_argument("--device", default="auto", type=device_argument, help=DEVICE_HELP)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--deepspeed", default=None, metavar="CFG", help=DEEPSPEED_HELP)
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_dataclass_options(p, BackboneTrainConfig)
    p.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    import torch

    from dihal_fast.backbone.train import train_backbone
    from dihal_fast.common.rundir import RESUME_HINT, run_directory

    if args.threads < 0:
        raise DihalValueError(f"--threads must be >= 0, got {args.threads}")
    config = dataclass_from_options(BackboneTrainConfig, args)  # refuses a bad value before the run directory
    if args.threads:
        torch.set_num_threads(args.threads)
    with run_directory(args.out, "dihal backbone train", resume=args.resume, resume_hint=RESUME_HINT):
        report = train_backbone(
            config,
            args.out,
            resume=args.resume,
            stop_at=args.stop_at,
            device=args.device,
            command=shlex.join(["dihal", *sys.argv[1:]]),
            progress=not args.no_progress,
            deepspeed_config=args.deepspeed,
        )
    for name, row in report["validation"].items():
        print(f"{name}: PPL {row['ppl']:.2f}  unigram {row['unigram_ppl']:.1f}  bigram {row['bigram_ppl']:.1f}")
    return 0


def run_info(args: argparse.Namespace) -> int:
    from dihal_fast.backbone.report import describe_backbone
    from dihal_fast.common.hf_loading import resolve_model_dir

    print(describe_backbone(resolve_model_dir(args.model)))
    return 0


def run_list(args: argparse.Namespace) -> int:
    import json

    from dihal_fast.backbone.report import format_backbone_rows, shipped_backbone_rows

    rows = shipped_backbone_rows()
    print(json.dumps(rows, indent=2) if args.json else format_backbone_rows(rows))
    return 0
