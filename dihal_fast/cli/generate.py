"""``dihal generate``: sample text from a hybrid or a plain backbone (float64 categorical sampling)."""
from __future__ import annotations

import argparse
import logging

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="sample continuations of a prompt from a hybrid or a backbone",
        description="Sample continuations of prompts from a DiHAL hybrid (a hybrid directory or a `dihal replace` "
        "run directory) or from a plain Hugging Face causal LM, drawing every token in float64.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", default=None, help="hybrid directory, replace run directory or HF checkpoint "
                        "directory (default: the shipped backbone)")
    parser.add_argument("--prompt", action="append", default=None,
                        help="prompt text; repeat the option for several prompts (default: one empty prompt)")
    parser.add_argument("--n-samples", type=int, default=3, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="tokens generated after the prompt")
    parser.add_argument("--nfe", type=int, default=None,
                        help="denoising steps of a hybrid's bridge (default: the hybrid's own setting)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy)")
    parser.add_argument("--top-k", type=int, default=None, help="sample only among the k most likely tokens")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--device", default="cpu", help="torch device")
    parser.add_argument("--out", default=None, help="also write the samples as JSON to this file")
    parser.set_defaults(func=run)


def generate_texts(lm, prompts: list[str], n_samples: int, max_new_tokens: int, temperature: float = 1.0,
                   top_k: int | None = None, nfe: int | None = None, seed: int = 0) -> dict:
    """Samples for every prompt: ``{"samples": [{prompt, text, token_ids}], "tokens_per_s", "seconds"}``."""
    import torch

    from dihal_fast.common.metrics import tokens_per_second

    generator = torch.Generator().manual_seed(seed)
    samples, seconds, n_tokens = [], 0.0, 0
    for prompt in prompts:
        ids = torch.tensor([lm.prompt_ids(prompt)], device=next(lm.model.parameters()).device)
        out = lm.sample(ids.expand(n_samples, -1), max_new_tokens, temperature, top_k, nfe, generator)
        seconds += out.seconds
        n_tokens += out.tokens.numel()
        for row in out.tokens.tolist():
            samples.append({"prompt": prompt, "text": lm.tokenizer.decode(row, skip_special_tokens=True), "token_ids": row})
    return {"samples": samples, "seconds": seconds, "tokens_per_s": tokens_per_second(n_tokens, seconds)}


def run(args: argparse.Namespace) -> int:
    import torch

    from dihal_fast.common import atomic_write_json
    from dihal_fast.common.rundir import check_output_file
    from dihal_fast.evaluate.models import load_lm
    from dihal_fast.common.sampling import PROTOCOL

    torch.manual_seed(args.seed)
    prompts = args.prompt or [""]
    if args.n_samples < 1:
        raise ValueError(f"--n-samples must be >= 1, got {args.n_samples}")
    if args.out:
        check_output_file(args.out)
    lm = load_lm(args.model, device=args.device)
    logger.info("sampling %d x %d tokens from the %s at %s", args.n_samples, args.max_new_tokens, lm.kind, lm.path)
    result = generate_texts(lm, prompts, args.n_samples, args.max_new_tokens, args.temperature, args.top_k,
                            args.nfe, args.seed)
    for i, sample in enumerate(result["samples"]):
        print(f"--- sample {i} (prompt {sample['prompt']!r})\n{sample['prompt']}{sample['text']}")
    print(f"--- {result['tokens_per_s']:.1f} tokens/s ({lm.kind})")
    if args.out:
        atomic_write_json(args.out, {"model": str(lm.path), "kind": lm.kind, "seed": args.seed, "nfe": args.nfe,
                                     "temperature": args.temperature, "top_k": args.top_k,
                                     "protocol": f"no early stop at EOS; prompt = start-of-document token + prompt "
                                     f"tokens; tokens/s = generated tokens / wall time of the sampling calls; {PROTOCOL}",
                                     **result})
    return 0
