"""What does running a trained bridge in bf16 cost in quality? The hybrid's held-out NLL by bridge dtype.

The layer-1 hybrid of the shipped backbone (trained first, ``dihal replace --layer 1 --steps 300``, unless
``--hybrid`` names one) scored on the blocks ``dihal evaluate`` scores (the last 32 x 128 tokens of the shipped
corpus), deterministic noise, in three loads: everything float32; the retained part in bfloat16 with the bridge
float32 (``bridge_dtype="float32"``); both in bfloat16 (``bridge_dtype="auto"``). Beside each: the backbone in the
same dtype, the hybrid / backbone perplexity ratio, and the largest change of a block's NLL against the float32
load. What the bf16 bridge adds is the third row minus the second.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_hybrid_options, hybrid_from_options, report, rows_figure, table  # noqa: E402
from bench_scoring_noise import block_nll, pooled  # noqa: E402

from dihal_fast.common.assets import corpus_or_default  # noqa: E402
from dihal_fast.common.hf_loading import load_causal_lm  # noqa: E402
from dihal_fast.evaluate.harness import EvalProtocolConfig, heldout_blocks  # noqa: E402
from dihal_fast.hybrid import HybridLM  # noqa: E402

LOADS = (("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "auto"))  # (dtype, bridge_dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_hybrid_options(parser, "runs/bench_bridge_dtype")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hybrid_dir = hybrid_from_options(args)
    backbone, tokenizer = load_causal_lm(None)
    blocks = heldout_blocks(tokenizer, corpus_or_default(None), EvalProtocolConfig()).blocks
    header = ["dtype", "bridge", "hybrid NLL", "backbone NLL", "PPL ratio", "NLL - float32 load", "max block change"]
    rows, figures, reference = [], {}, None
    for dtype, bridge in LOADS:
        backbone_nll = pooled(block_nll(load_causal_lm(None, dtype)[0], blocks))
        model = HybridLM.from_pretrained(hybrid_dir, dtype=getattr(torch, dtype), bridge_dtype=bridge).eval()
        per_block = block_nll(model, blocks)
        reference = per_block if reference is None else reference
        nll = pooled(per_block)
        shift = nll - pooled(reference)
        change = float((per_block - reference).abs().max())
        figures[f"{dtype}_{bridge}"] = {"hybrid_nll": nll, "backbone_nll": backbone_nll, "nll_shift": shift,
                                        "max_block_change": change,
                                        "bridge_param_dtype": str(model.bridge.dtype)}  # fmt: skip
        ratio = torch.tensor(nll - backbone_nll).exp()
        rows.append([dtype, bridge, f"{nll:.5f}", f"{backbone_nll:.5f}", f"{ratio:.4f}", f"{shift:+.5f}",
                     f"{change:.5f}"])  # fmt: skip
    added = figures["bfloat16_auto"]["hybrid_nll"] - figures["bfloat16_float32"]["hybrid_nll"]
    figures["table"], figures["bf16_bridge_adds_nats"] = rows_figure(header, rows), added
    body = (
        f"{int(blocks.numel())} held-out tokens, noise seed 0 (deterministic), {args.threads} thread(s); hybrid "
        f"{hybrid_dir}\n\n{table(header, rows)}\n\nthe bf16 bridge adds {added:+.5f} nats to the bf16 hybrid's NLL."
    )
    report("A trained bridge in bf16: held-out NLL by bridge dtype", body, question="bridge_dtype_quality",
           figures=figures)  # fmt: skip


if __name__ == "__main__":
    main()
