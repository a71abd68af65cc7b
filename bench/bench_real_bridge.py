"""Which bridge makes a usable hybrid of a real pretrained model at a CPU budget? ``--model`` (SmolLM2-135M-Instruct
by default) at its selected layer, one ``dihal replace`` run per design, each with the same CPU-second budget, data
and validation.

Designs: ``--copied-layers k`` for each given ``k`` (``0``: the paper's bridge, everything learned from ``c(x)``;
``l*``: the backbone's layers ``1..l*`` copied into the context encoder, the denoiser learning a correction; in
between: the last ``l* - k`` replaced layers learned); ``k:random`` is the from-scratch control of design ``k``: the
same architecture with the copied layers freshly initialised and trained with the bridge (``--copied-init random
--train-copied-layers``), so the gap to ``k`` is what the backbone's weights contribute; a suffix ``/SCALING`` trains
the design with ``--target-scaling SCALING`` (``scalar`` when none is given). Each run is ``dihal
replace`` in its own process on one thread (resumable: a rerun continues a killed run; a finished one is read back),
``--budget-clock cpu``; the table gives the validation hybrid and backbone PPL, their ratio, KL(backbone || hybrid),
the bridge loss, steps, tokens and CPU seconds, and the bridge's parameters (trainable, and all of them) beside the
replaced layers'.

    python bench/bench_real_bridge.py --layer 3 --copied 0 2 2:random 3 2/clipped --minutes 10 \\
        --corpus ../shared/data/text/*.train.txt --val-corpus valid.txt --work /work/runs/real_bridge
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from _common import add_real_model_options, real_model, real_model_replace, report, rows_figure, table, target

from dihal_fast.replace.config import TARGET_SCALINGS


def design(text: str) -> tuple[int, str, str]:
    """``K[:random][/SCALING]`` -> (copied layers, their initialisation, the target scaling)."""
    layers, _, scaling = text.partition("/")
    copied, _, init = layers.partition(":")
    if not copied.isdigit() or init not in ("", "random") or scaling not in ("", *TARGET_SCALINGS):
        raise argparse.ArgumentTypeError(f"a design is K, K:random, K/SCALING or K:random/SCALING, got {text!r}")
    return int(copied), init or "backbone", scaling or "scalar"


def replace_run(model: Path, args: argparse.Namespace, copied: int, init: str, scaling: str) -> dict:
    """``dihal replace`` for ``copied`` copied layers initialised from ``init``, targets scaled by ``scaling``, in
    ``WORK/copied_K[_random][_SCALING]`` (resumed if killed); its result.json."""
    suffix = ("" if init == "backbone" else f"_{init}") + ("" if scaling == "scalar" else f"_{scaling}")
    out = args.work / f"copied_{copied}{suffix}"
    if (out / "result.json").is_file():
        return json.loads((out / "result.json").read_text())
    from_scratch = ("--copied-init", init, "--train-copied-layers") if init != "backbone" else ()
    real_model_replace(
        model, args, out,
        "--copied-layers", str(copied), "--max-minutes", str(args.minutes), "--steps", str(args.steps),
        "--checkpoint-every", "25", "--max-train-tokens", str(args.max_train_tokens), "--target-scaling", scaling,
        *from_scratch,
    )  # fmt: skip
    return json.loads((out / "result.json").read_text())


def parameter_counts(result: dict) -> dict:
    """Trainable and total parameters of the exported bridge, and of the backbone layers it replaces."""
    from dihal_fast.hybrid import HybridLM

    hybrid = HybridLM.from_pretrained(result["hybrid_dir"])
    bridge = hybrid.bridge
    copied = {id(p) for p in bridge.copied.parameters()} if bridge.copied is not None else set()
    learned = sum(p.numel() for p in bridge.parameters() if id(p) not in copied)
    total = sum(p.numel() for p in bridge.parameters())
    per_layer = sum(p.numel() for p in hybrid.upper.base_model.layers[0].parameters())  # the layers are alike
    return {"learned_params": learned, "bridge_params": total, "replaced_params": per_layer * hybrid.config.layer}


@torch.no_grad()
def error_by_dimension(result: dict, args: argparse.Namespace, top: int = 4) -> dict:
    """Where the rebuilt ``h_l*`` misses, on the validation blocks: the share of the teacher's variance and of the
    bridge's squared error that the ``top`` highest-variance dimensions ("massive activations") hold (in ``h``'s own
    units, whatever the bridge's target scaling)."""
    from dihal_fast.common.hf_loading import load_causal_lm
    from dihal_fast.hybrid import HybridLM, hidden_state
    from dihal_fast.replace.data import load_blocks

    hybrid = HybridLM.from_pretrained(result["hybrid_dir"]).eval()
    backbone, tokenizer = load_causal_lm(result["model"], "float32")
    blocks = load_blocks(tokenizer, args.corpus, 128, args.val_blocks, 4 * 128, args.val_corpus).val
    mean = torch.tensor(hybrid.bridge.config.target_mean)
    error = variance = None
    for start in range(0, blocks.shape[0], 8):
        ids = blocks[start : start + 8]
        target = (hidden_state(backbone, ids, args.layer) - mean).flatten(0, 1).double()
        rebuilt = (hybrid(ids).bridge_hidden_state - mean).flatten(0, 1).double()
        batch_error, batch_square = (rebuilt - target).pow(2).sum(0), target.pow(2).sum(0)
        error = batch_error if error is None else error + batch_error
        variance = batch_square if variance is None else variance + batch_square
    assert error is not None and variance is not None
    massive = torch.topk(variance, top).indices
    return {
        "massive_dims": ",".join(map(str, massive.tolist())),
        "massive_variance_share": float(variance[massive].sum() / variance.sum()),
        "massive_error_share": float(error[massive].sum() / error.sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_real_model_options(parser)
    parser.add_argument(
        "--copied",
        type=design,
        nargs="+",
        default=[design(d) for d in ("0", "2", "2:random", "3")],
        help="each design: copied layers K, or K:random (the same layers freshly initialised and trained), each "
        "with an optional /SCALING (--target-scaling)",
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="CPU minutes of bridge training per design")
    parser.add_argument("--steps", type=int, default=300, help="--steps (the schedule's length) of every run")
    parser.add_argument("--max-train-tokens", type=int, default=2_000_000)
    parser.add_argument("--question", default="real_bridge_smollm2")
    args = parser.parse_args()
    model = real_model(args)
    rows = []
    for copied, init, scaling in args.copied:
        result = replace_run(model, args, copied, init, scaling)
        validation = result["validation"]
        rows.append(
            {
                "copied_layers": copied,
                "copied_init": init,
                "target_scaling": scaling,
                **parameter_counts(result),
                **error_by_dimension(result, args),
                "steps": result["steps_trained"],
                "tokens": result["tokens_seen"],
                "cpu_s": result["train_seconds"],
                "bridge_loss": validation["bridge_loss"],
                "hybrid_ppl": validation["hybrid_ppl"],
                "backbone_ppl": validation["backbone_ppl"],
                "ppl_ratio": validation["ppl_ratio"],
                "kl": validation["kl"],
            }
        )
    columns = list(rows[0])
    values = [[row[c] for c in columns] for row in rows]
    body = table(columns, values)
    best = min(rows, key=lambda row: row["kl"])
    targets = [
        target(
            f"hybrid PPL <= 1.5x the backbone's and KL <= 0.4 nats at {args.minutes:g} CPU-minutes",
            f"best design copies {best['copied_layers']} layers ({best['copied_init']}, {best['target_scaling']}): "
            f"ratio {best['ppl_ratio']:.3f}, KL {best['kl']:.3f}",
            best["ppl_ratio"] <= 1.5 and best["kl"] <= 0.4,
        )
    ]
    report(
        f"Bridge designs on {model.stem} at hidden state {args.layer}, {args.minutes:g} CPU-minutes each",
        body,
        question=args.question,
        figures={"designs": rows_figure(columns, values), "layer": args.layer, "cpu_minutes": args.minutes},
        targets=targets,
    )


if __name__ == "__main__":
    main()
