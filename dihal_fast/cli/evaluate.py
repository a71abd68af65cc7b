"""``dihal evaluate``: a hybrid against its backbone (and same-budget controls) with a named protocol."""
from __future__ import annotations

import argparse


def add_eval_options(parser: argparse.ArgumentParser) -> None:
    """The evaluator and the options of :class:`~dihal_fast.evaluate.harness.EvalSettings`."""
    from dihal_fast.evaluate.harness import EvalSettings

    d = EvalSettings()
    parser.add_argument("--evaluator", default=None,
                        help="causal LM scoring the samples (Gen PPL); default: the shipped backbone")
    parser.add_argument("--evaluator-dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"],
                        help="dtype of the evaluator LM (recorded in the report)")
    parser.add_argument("--retokenise", action="store_true",
                        help="allow an evaluator whose tokenizer differs from the hybrid's (samples are decoded and retokenised)")
    parser.add_argument("--seq-len", type=int, default=d.seq_len, help="tokens per held-out block")
    parser.add_argument("--eval-blocks", type=int, default=d.eval_blocks, help="held-out blocks (the corpus tail) for NLL/PPL/KL")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="blocks per forward pass")
    parser.add_argument("--n-samples", type=int, default=d.n_samples, help="samples per model for Gen PPL, entropy, diversity, speed")
    parser.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="tokens per sample")
    parser.add_argument("--temperature", type=float, default=d.temperature, help="sampling temperature")
    parser.add_argument("--nfe", type=int, default=d.nfe, help="denoising steps of hybrid bridges (default: each hybrid's own)")
    parser.add_argument("--seed", type=int, default=d.seed, help="random seed")


def settings_from(args: argparse.Namespace):
    from dihal_fast.evaluate.harness import EvalSettings

    return EvalSettings(seq_len=args.seq_len, eval_blocks=args.eval_blocks, batch_size=args.batch_size,
                        n_samples=args.n_samples, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        nfe=args.nfe, seed=args.seed)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="NLL, PPL, KL, Gen PPL, entropy, diversity and speed of a hybrid against its backbone",
        description="Score a hybrid and its backbone on the held-out tail of a corpus (token-pooled NLL/PPL, "
        "KL(backbone || hybrid)), sample from both (Gen PPL under an evaluator LM, unigram entropy, DiHAL and LD4LG "
        "diversity, tokens/s), optionally with controls: the oracle and worst layers of a `dihal sweep` run and a "
        "Diffusion-LM-like embedding-space baseline with the same training budget. Writes RUN/evaluate.json "
        "(resumable: finished sections in RUN/sections are reused).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--hybrid", required=True, help="hybrid directory or `dihal replace` run directory")
    parser.add_argument("--corpus", nargs="+", default=None, help="corpus files/directories (default: the shipped corpus)")
    parser.add_argument("--out", required=True, help="run directory for evaluate.json")
    parser.add_argument("--sweep", default=None,
                        help="a `dihal sweep` run: also evaluate its lowest- and highest-bridge-loss layers (oracle, worst)")
    parser.add_argument("--diffusion-lm-steps", type=int, default=0,
                        help="train the Diffusion-LM-like control for this many steps (0 = skip; use the hybrid's budget)")
    add_eval_options(parser)
    parser.set_defaults(func=run)


def corpus_or_default(corpus: list[str] | None) -> list[str]:
    if corpus:
        return corpus
    from dihal_fast.backbone import default_corpus

    return [str(default_corpus())]


def run(args: argparse.Namespace) -> int:
    from dihal_fast.common import seed_everything
    from dihal_fast.common.rundir import run_directory
    from dihal_fast.evaluate.report import METRICS
    from dihal_fast.evaluate.run import evaluate_hybrid
    from dihal_fast.evaluate.sweep import sweep_controls

    seed_everything(args.seed)
    controls = sweep_controls(args.sweep) if args.sweep else None
    with run_directory(args.out, "dihal evaluate"):
        report = evaluate_hybrid(args.hybrid, corpus_or_default(args.corpus), args.out, settings_from(args),
                                 args.evaluator, args.retokenise, controls, args.diffusion_lm_steps, args.evaluator_dtype)
    columns = {"backbone": report["backbone"], "hybrid": report["hybrid"], **report["controls"]}
    print("metric".ljust(16) + "".join(name.rjust(14) for name in columns))
    for metric in METRICS:
        cells = ["n/a" if col.get(metric) is None else f"{col[metric]:.4g}" for col in columns.values()]
        print(metric.ljust(16) + "".join(c.rjust(14) for c in cells))
    print(f"report: {args.out}/evaluate.json")
    return 0
