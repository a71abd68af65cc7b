"""``dihal generate``: a thin shell over :func:`dihal_fast.pipeline.generate` (flags from ``GenerateConfig``)."""

from __future__ import annotations

import argparse

from dihal_fast.common.options import HelpFormatter, add_dataclass_options, dataclass_from_options


def register(subparsers: argparse._SubParsersAction) -> None:
    from dihal_fast.pipeline import GenerateConfig

    parser = subparsers.add_parser(
        "generate",
        help="sample continuations of a prompt from a hybrid or a backbone",
        description="Sample continuations of prompts from a DiHAL hybrid (a hybrid directory or a `dihal replace` "
        "run directory) or from a plain Hugging Face causal LM, drawing every token in float64.",
        formatter_class=HelpFormatter,
    )
    add_dataclass_options(parser, GenerateConfig)
    parser.add_argument("--out", default=None, help="also write the samples as JSON to this file")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dihal_fast.pipeline import GenerateConfig, generate

    report = generate(dataclass_from_options(GenerateConfig, args), args.out)
    for i, sample in enumerate(report["samples"]):
        print(f"--- sample {i} (prompt {sample['prompt']!r})\n{sample['prompt']}{sample['text']}")
    print(f"--- {report['tokens_per_s']:.1f} tokens/s ({report['kind']})")
    return 0
