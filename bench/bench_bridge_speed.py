"""Which bridge keeps up with its backbone? Tokens/s and PPL of hybrids, measured together.

Trains (or reuses, from ``--out``) one bridge per variant at layer 1 of the shipped backbone with the
demo's budget (200 steps, 8 x 128 tokens, seed 0), then for each hybrid and the backbone:

* PPL ratio: token-pooled PPL on the demo's 32 held-out blocks over the backbone's (bridge noise seed 0);
* tokens/s: 16 unconditional samples of 64 tokens (the demo's protocol), backbone and hybrids interleaved,
  ``--rounds`` rounds, fastest call of each; as wall time and as the process's CPU time on one thread
  (the CPU-time ratio is the one a busy shared machine distorts least).

Target: hybrid tokens/s >= 0.9x the backbone with the PPL ratio <= 1.15.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report, rows_figure, table, target  # noqa: E402

# name -> bridge options (differences from BridgeConfig's defaults) and the nfe used at generation
VARIANTS = {
    "2 context blocks, UNet depth 2, nfe 2 (old default)": ({"context_layers": 2, "nfe": 2, "unet_depth": 2}, 2),
    "2 context blocks, UNet depth 2, nfe 1": ({"context_layers": 2, "nfe": 1, "unet_depth": 2}, 1),
    "1 context block, UNet depth 2, nfe 1": ({"unet_depth": 2}, 1),
    "1 context block, UNet depth 1, nfe 1 (new default)": ({"unet_depth": 1}, 1),
    "1 context block, UNet depth 0, nfe 1": ({"unet_depth": 0}, 1),
}


def train(out: Path, options: dict, steps: int) -> Path:
    """The hybrid directory of a finished (or now trained) run in ``out``."""
    from dihal_fast.backbone import default_corpus
    from dihal_fast.replace import train_bridge
    from dihal_fast.replace.config import BridgeTrainConfig

    if not (out / "result.json").is_file():
        train_bridge(None, 1, default_corpus(), out, BridgeTrainConfig(steps=steps, bridge=options), resume=True)
    return out / "hybrid"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/bench_bridge_speed", help="one training run per variant (reused)")
    parser.add_argument("--steps", type=int, default=200, help="bridge training steps (the demo's budget)")
    parser.add_argument("--rounds", type=int, default=8, help="interleaved sampling rounds (fastest kept)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from dihal_fast.backbone import default_corpus
    from dihal_fast.evaluate.harness import EvalProtocolConfig, heldout_blocks
    from dihal_fast.evaluate.loaded_lm import load_lm
    from dihal_fast.evaluate.scoring import teacher_forced

    hybrids = {
        name: load_lm(train(Path(args.out) / f"variant_{i}", options, args.steps), nfe=nfe)
        for i, (name, (options, nfe)) in enumerate(VARIANTS.items())
    }
    backbone = load_lm(next(iter(hybrids.values())).backbone_dir)
    settings = EvalProtocolConfig()
    blocks = heldout_blocks(backbone.tokenizer, [default_corpus()], settings).blocks
    base_ppl = teacher_forced(backbone.logits, blocks, settings.batch_size)["ppl"]
    ppl = {}
    for name, lm in hybrids.items():
        torch.manual_seed(0)
        ppl[name] = teacher_forced(lm.logits, blocks, settings.batch_size)["ppl"] / base_ppl
    prompt = torch.tensor([backbone.prompt_ids("")]).expand(settings.n_samples, -1)
    models = {"backbone": backbone, **hybrids}
    wall = {name: 0.0 for name in models}
    cpu = {name: 0.0 for name in models}
    for _ in range(args.rounds):
        for name, lm in models.items():
            start_cpu, start = time.process_time(), time.perf_counter()
            lm.sample(prompt, settings.max_new_tokens, 1.0, None, torch.Generator().manual_seed(0))
            tokens = settings.n_samples * settings.max_new_tokens
            wall[name] = max(wall[name], tokens / (time.perf_counter() - start))
            cpu[name] = max(cpu[name], tokens / (time.process_time() - start_cpu))
    rows = [
        [name, ppl.get(name, 1.0), wall[name], wall[name] / wall["backbone"], cpu[name], cpu[name] / cpu["backbone"]]
        for name in models
    ]
    header = ["model", "PPL / backbone", "tokens/s (wall)", "x backbone", "tokens/s (CPU)", "x backbone"]
    body = (
        f"Layer 1 of the shipped backbone, {args.steps} training steps per bridge, 1 thread, "
        f"{settings.n_samples} x {settings.max_new_tokens} tokens per sampling call, fastest of {args.rounds} "
        "interleaved rounds.\n\n" + table(header, rows)
    )
    default = next(row for row in rows if row[0].endswith("(new default)"))  # a VARIANTS name
    report(
        "Bridge cost at generation: tokens/s and PPL together",
        body,
        question="bridge_speed",
        figures={"variants": rows_figure(header, rows), "training_steps": args.steps, "rounds": args.rounds},
        targets=[
            target(
                "default hybrid tokens/s >= 0.9x the backbone with PPL ratio <= 1.15",
                f"{default[5]:.3g} (PPL {default[1]:.4g}, CPU time)",
                default[5] >= 0.9 and default[1] <= 1.15,
            )
        ],
    )


if __name__ == "__main__":
    main()
