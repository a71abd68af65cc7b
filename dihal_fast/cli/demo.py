"""``dihal demo``: the main job on the shipped backbone and corpus, end to end, with a report."""
from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from dihal_fast.evaluate.demo import DemoSettings

    d = DemoSettings()
    parser = subparsers.add_parser(
        "demo",
        help="locate -> replace -> evaluate -> generate on the shipped backbone, with report.md",
        description="The whole DiHAL pipeline on the shipped backbone and its default corpus (or your own): pick the "
        "insertion layer from the geometry, train a bridge there, evaluate the hybrid against the backbone and a "
        "Diffusion-LM-like control, sample from it, and write RUN/report.md (tables, plots), RUN/report.json and "
        "RUN/samples.json. About 15 minutes on 2 CPU cores with the defaults; rerunning resumes finished stages.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out", default="dihal_demo", help="run directory")
    parser.add_argument("--model", default=None, help="HF causal-LM checkpoint directory (default: the shipped backbone)")
    parser.add_argument("--corpus", nargs="+", default=None, help="corpus files/directories (default: the shipped corpus)")
    parser.add_argument("--locate-max-tokens", type=int, default=d.locate_max_tokens, help="tokens locate reads")
    parser.add_argument("--locate-repeats", type=int, default=d.locate_repeats, help="repeated subsamples for the proxies")
    parser.add_argument("--locate-sample", type=int, default=d.locate_sample, help="tokens per subsample")
    parser.add_argument("--train-steps", type=int, default=d.train_steps,
                        help="bridge training steps (the Diffusion-LM control gets the same budget)")
    parser.add_argument("--seq-len", type=int, default=d.seq_len, help="tokens per block (locate, training, evaluation)")
    parser.add_argument("--val-blocks", type=int, default=d.val_blocks,
                        help="corpus-tail blocks held out from bridge training (validation)")
    parser.add_argument("--no-diffusion-lm", action="store_true", help="skip the Diffusion-LM-like control")
    parser.add_argument("--n-samples", type=int, default=d.evaluation.n_samples, help="samples per model for the sample metrics")
    parser.add_argument("--max-new-tokens", type=int, default=d.evaluation.max_new_tokens, help="tokens per sample")
    parser.add_argument("--eval-blocks", type=int, default=d.evaluation.eval_blocks,
                        help="corpus-tail blocks for NLL/PPL/KL (at most --val-blocks, so never trained on)")
    parser.add_argument("--seed", type=int, default=d.seed, help="random seed")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (0 = the cores other processes leave free, re-checked while it runs)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dihal_fast.cli.evaluate import corpus_or_default
    from dihal_fast.common import seed_everything
    from dihal_fast.common.rundir import run_directory
    from dihal_fast.evaluate.demo import DemoSettings, run_demo
    from dihal_fast.evaluate.harness import EvalSettings

    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0, got {args.threads}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    seed_everything(args.seed)
    settings = DemoSettings(
        locate_max_tokens=args.locate_max_tokens, locate_repeats=args.locate_repeats, locate_sample=args.locate_sample,
        seq_len=args.seq_len, train_steps=args.train_steps, val_blocks=args.val_blocks,
        diffusion_lm=not args.no_diffusion_lm, seed=args.seed,
        evaluation=EvalSettings(seq_len=args.seq_len, eval_blocks=args.eval_blocks, n_samples=args.n_samples,
                                max_new_tokens=args.max_new_tokens, seed=args.seed),
    )
    with run_directory(args.out, "dihal demo"):
        summary = run_demo(args.out, args.model, corpus_or_default(args.corpus), settings)
    t = summary["targets"]
    print(f"selected layer {summary['selected_layer']}; hybrid/backbone PPL {t['ppl_ratio']:.3f} "
          f"(target <= 1.25: {'met' if t['ppl_ratio_met'] else 'missed'}); tokens/s ratio {t['tokens_per_s_ratio']:.3f}")
    print(f"report: {args.out}/report.md")
    return 0
