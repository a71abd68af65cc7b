"""``dihal backbone``: train the small default causal LM (``train``) and describe a checkpoint (``info``)."""
from __future__ import annotations

import argparse
import logging
import shlex
import sys

from dihal_fast.backbone.config import ModelConfig, TrainConfig

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "backbone",
        help="train or describe the small default backbone LM",
        description="Train a byte-level BPE tokenizer + Llama causal LM on UTF-8 text, or describe a checkpoint.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    actions = parser.add_subparsers(dest="backbone_command", metavar="ACTION", required=True)
    _register_train(actions)
    info = actions.add_parser(
        "info",
        help="architecture, parameters, training data and validation perplexity of a backbone",
        description="Describe a backbone directory (reads config.json and training_report.json).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    info.add_argument("--model", default=None, help="checkpoint directory (default: the shipped backbone)")
    info.set_defaults(func=run_info)


def _register_train(actions: argparse._SubParsersAction) -> None:
    m, t = ModelConfig(), TrainConfig()
    p = actions.add_parser(
        "train",
        help="train a backbone (tokenizer + LlamaForCausalLM) on text files",
        description="Train a byte-level BPE tokenizer and a LlamaForCausalLM on UTF-8 text files, with "
        "warmup + cosine LR, AdamW, gradient clipping, periodic validation, checkpoints and --resume. "
        "Held-out splits: --valid files, else the X.valid.txt next to every X.train.txt, else the tail of each file.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--corpus", nargs="+", required=True, help="UTF-8 training text files")
    p.add_argument("--valid", nargs="+", default=None, help="held-out UTF-8 text files (one validation split each)")
    p.add_argument("--valid-fraction", type=float, default=t.valid_fraction, help="tail fraction held out per file when no valid files exist")
    p.add_argument("--out", required=True, help="run directory (model, tokenizer, log, report, resume state)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--steps", type=int, default=t.steps, help="total optimizer steps (the LR schedule spans these)")
    p.add_argument("--stop-at", type=int, default=None, help="end this invocation after this step with a checkpoint (continue with --resume)")
    p.add_argument("--batch-size", type=int, default=t.batch_size, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=m.seq_len, help="tokens per training sequence (also the model's context)")
    p.add_argument("--lr", type=float, default=t.lr, help="peak learning rate")
    p.add_argument("--min-lr-ratio", type=float, default=t.min_lr_ratio, help="final LR as a fraction of the peak")
    p.add_argument("--warmup-steps", type=int, default=t.warmup_steps, help="linear warmup steps")
    p.add_argument("--weight-decay", type=float, default=t.weight_decay, help="AdamW weight decay on matrices")
    p.add_argument("--grad-clip", type=float, default=t.grad_clip, help="gradient-norm clipping threshold")
    p.add_argument("--seed", type=int, default=t.seed, help="seed of initialisation and data order")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default=t.precision,
                   help="bf16 autocast or fp32; auto = bf16 on CUDA or AMX CPUs, fp32 otherwise")
    p.add_argument("--device", default="cpu", help="torch device to train on (cpu, cuda, cuda:1, ...)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--eval-every", type=int, default=t.eval_every, help="steps between quick validation estimates")
    p.add_argument("--eval-windows", type=int, default=t.eval_windows, help="windows per split in the quick estimates")
    p.add_argument("--checkpoint-every", type=int, default=t.checkpoint_every, help="steps between checkpoints")
    p.add_argument("--vocab-size", type=int, default=m.vocab_size, help="BPE vocabulary size (incl. 3 special tokens)")
    p.add_argument("--layers", type=int, default=m.num_layers, help="transformer layers")
    p.add_argument("--hidden", type=int, default=m.hidden_size, help="model width")
    p.add_argument("--heads", type=int, default=m.num_heads, help="attention heads")
    p.add_argument("--intermediate", type=int, default=m.intermediate_size, help="SwiGLU inner width")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run_train)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    model = ModelConfig(vocab_size=args.vocab_size, hidden_size=args.hidden, num_layers=args.layers,
                        num_heads=args.heads, intermediate_size=args.intermediate, seq_len=args.seq_len)
    return TrainConfig(
        corpus=list(args.corpus), valid=list(args.valid or []), valid_fraction=args.valid_fraction, model=model,
        steps=args.steps, batch_size=args.batch_size, lr=args.lr, min_lr_ratio=args.min_lr_ratio,
        warmup_steps=args.warmup_steps, weight_decay=args.weight_decay, grad_clip=args.grad_clip, seed=args.seed,
        precision=args.precision, eval_every=args.eval_every, eval_windows=args.eval_windows,
        checkpoint_every=args.checkpoint_every,
    )


def run_train(args: argparse.Namespace) -> int:
    import torch

    from dihal_fast.backbone.train import train_backbone
    from dihal_fast.common.rundir import run_directory

    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0, got {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)
    with run_directory(args.out, "dihal backbone train"):
        report = train_backbone(
            config_from_args(args), args.out, resume=args.resume, stop_at=args.stop_at, device=args.device,
            command=shlex.join(["dihal", *sys.argv[1:]]), progress=not args.no_progress,
        )
    for name, row in report["validation"].items():
        print(f"{name}: PPL {row['ppl']:.2f}  unigram {row['unigram_ppl']:.1f}  bigram {row['bigram_ppl']:.1f}")
    return 0


def run_info(args: argparse.Namespace) -> int:
    from dihal_fast.backbone import default_model_dir
    from dihal_fast.backbone.report import describe_backbone

    print(describe_backbone(args.model or default_model_dir()))
    return 0
