"""``dihal sweep``: does the geometry score predict which layer a bridge rebuilds best?"""
from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from dihal_fast.evaluate.sweep import SweepSettings

    d = SweepSettings()
    parser = subparsers.add_parser(
        "sweep",
        help="train a fixed-budget bridge per layer and correlate the geometry score with the bridge loss",
        description="Run `dihal locate` with repeated score runs, train a bridge for every candidate layer with the "
        "same budget, take each one's validation bridge loss, and report Spearman, Kendall and Pearson correlations "
        "between the score and -bridge loss (mean +- std over the score runs), the rank gap between the best-scoring "
        "and the lowest-loss layer, and a plot. Writes RUN/sweep.json and RUN/sweep.png; reruns reuse finished layers.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", default=None, help="HF causal-LM checkpoint directory (default: the shipped backbone)")
    parser.add_argument("--corpus", nargs="+", default=None, help="corpus files/directories (default: the shipped corpus)")
    parser.add_argument("--out", required=True, help="run directory")
    parser.add_argument("--budget-steps", type=int, default=d.budget_steps, help="bridge training steps per layer")
    parser.add_argument("--score-repeats", type=int, default=d.score_repeats, help="repeated score runs (subsamples)")
    parser.add_argument("--score-sample", type=int, default=d.score_sample, help="tokens per score run")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens, help="tokens locate reads from the corpus")
    parser.add_argument("--layers", type=int, nargs="+", default=None, help="candidate layers (default 1..L-1)")
    parser.add_argument("--seq-len", type=int, default=d.seq_len, help="tokens per block (locate and training)")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="blocks per bridge training step")
    parser.add_argument("--val-blocks", type=int, default=d.val_blocks, help="held-out blocks (corpus tail) for the bridge loss")
    parser.add_argument("--seed", type=int, default=d.seed, help="random seed")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dihal_fast.cli.evaluate import corpus_or_default
    from dihal_fast.common.rundir import run_directory
    from dihal_fast.evaluate.sweep import SweepSettings, run_sweep

    settings = SweepSettings(budget_steps=args.budget_steps, score_repeats=args.score_repeats,
                             score_sample=args.score_sample, max_tokens=args.max_tokens, seq_len=args.seq_len,
                             batch_size=args.batch_size, val_blocks=args.val_blocks, seed=args.seed)
    with run_directory(args.out, "dihal sweep"):
        report = run_sweep(args.model, corpus_or_default(args.corpus), args.out, settings, args.layers)
    print(f"{'layer':>5} {'score':>9} {'bridge loss':>12}")
    for row in report["layers"]:
        print(f"{row['layer']:>5} {row['score']:>9.3f} {row['bridge_loss']:>12.4f}")
    for name in ("spearman", "kendall", "pearson"):
        cell = report[name]
        std = "" if cell["std"] is None else f" +- {cell['std']:.4f}"
        print(f"{name}: {cell['mean']:.4f}{std}" if cell["mean"] is not None else f"{name}: undefined (constant input)")
    print(f"rank gap: {report['rank_gap']} (selected layer {report['predicted_layer']}, lowest loss "
          f"{report['observed_best_layer']}); report: {args.out}/sweep.json, plot: {args.out}/sweep.png")
    return 0
