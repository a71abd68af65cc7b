"""How much the bridge's noise moves a hybrid's scores: deterministic (fixed ``noise_seed``) against stochastic.

The README's "Scoring is deterministic" figures: held-out NLL of the shipped backbone's layer-1 hybrid on the
blocks ``dihal evaluate`` scores (the last 32 x 128 tokens of the shipped corpus), for noise seeds 0-3 (each
scored twice), for repeated stochastic calls (``config.stochastic_noise = True``), and per block the spread
between two stochastic scorings and between noise seeds 0 and 1. The hybrid is trained first
(``dihal replace --layer 1 --steps 300``, default bridge) unless ``--hybrid`` names one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_hybrid_options, hybrid_from_options, report, rows_figure, table  # noqa: E402

from dihal_fast.common.assets import corpus_or_default  # noqa: E402
from dihal_fast.common.hf_loading import load_causal_lm  # noqa: E402
from dihal_fast.common.metrics import token_nll  # noqa: E402
from dihal_fast.evaluate.harness import EvalProtocolConfig, heldout_blocks  # noqa: E402
from dihal_fast.hybrid import HybridLM  # noqa: E402


@torch.no_grad()
def block_nll(model, blocks: torch.Tensor, batch_size: int = 8) -> torch.Tensor:
    """Per-block mean NLL (float64 ``[N]``) of ``model`` on ``blocks[N, T]``."""
    sums, counts = [], []
    for start in range(0, blocks.shape[0], batch_size):
        ids = blocks[start : start + batch_size]
        total, count = token_nll(model(input_ids=ids).logits, ids)
        sums.append(total)
        counts.append(count)
    return torch.cat(sums) / torch.cat(counts)


def pooled(per_block: torch.Tensor) -> float:
    """Token-pooled NLL of equal-length blocks: the mean of their per-block means."""
    return float(per_block.mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_hybrid_options(parser, "runs/bench_scoring_noise")
    parser.add_argument("--stochastic-calls", type=int, default=8, help="stochastic scorings of the blocks")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    hybrid_dir = hybrid_from_options(args)
    model = HybridLM.from_pretrained(hybrid_dir).eval()
    backbone, tokenizer = load_causal_lm(None)
    settings = EvalProtocolConfig()
    blocks = heldout_blocks(tokenizer, corpus_or_default(None), settings).blocks

    backbone_nll = pooled(block_nll(backbone, blocks))
    model.config.stochastic_noise = False
    seeds = {}
    for seed in range(4):
        model.config.noise_seed = seed
        first, second = block_nll(model, blocks), block_nll(model, blocks)
        seeds[seed] = (first, bool(torch.equal(first, second)))
    model.config.stochastic_noise = True
    torch.manual_seed(0)
    stochastic = [block_nll(model, blocks) for _ in range(args.stochastic_calls)]
    model.config.stochastic_noise, model.config.noise_seed = False, 0

    two_calls = (stochastic[0] - stochastic[1]).abs()
    two_seeds = (seeds[0][0] - seeds[1][0]).abs()
    header = ["scoring", "held-out NLL", "repeatable"]
    rows = [["backbone", f"{backbone_nll:.4f}", "yes"]]
    rows += [
        [f"deterministic, noise_seed {s}", f"{pooled(nll):.4f}", "yes" if same else "NO"]
        for s, (nll, same) in seeds.items()
    ]
    values = [pooled(nll) for nll in stochastic]
    rows.append([f"stochastic, {len(values)} calls", f"{min(values):.4f} - {max(values):.4f}", "no (by design)"])
    body = table(header, rows)
    body += (
        f"\n\nPer {blocks.shape[1]}-token block: two stochastic scorings differ by {float(two_calls.mean()):.4f} "
        f"nats/token on average ({float(two_calls.max()):.4f} at most); noise seeds 0 and 1 by "
        f"{float(two_seeds.mean()):.4f} ({float(two_seeds.max()):.4f}). Hybrid `{hybrid_dir}`; "
        f"{blocks.shape[0]} x {blocks.shape[1]} held-out tokens of the shipped corpus (the blocks `dihal evaluate` "
        f"scores); torch threads {args.threads}."
    )
    report(
        "Hybrid scoring: deterministic against stochastic bridge noise",
        body,
        question="scoring_noise",
        figures={
            "nll": rows_figure(header, rows),
            "backbone_nll": backbone_nll,
            "block_diff_stochastic_mean": float(two_calls.mean()),
            "block_diff_stochastic_max": float(two_calls.max()),
            "block_diff_seeds_mean": float(two_seeds.mean()),
            "block_diff_seeds_max": float(two_seeds.max()),
        },
    )


if __name__ == "__main__":
    main()
