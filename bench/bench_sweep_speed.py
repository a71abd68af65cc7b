"""What a layer sweep's bridge training costs per layer-step, before and after training the layers together.

Before (``dihal sweep`` up to 0.3.0): one ``train_bridge`` per candidate layer, each loading the backbone and the
corpus blocks, computing its own target statistics, and running one teacher forward pass per training batch and
per validation batch. After (:func:`dihal_fast.pipeline.sweep_stage.sweep_bridges`): the backbone and blocks
are loaded once and one teacher forward pass per batch serves every layer (the per-layer runs are otherwise the
same; the script checks that both give the same bridge losses). Also timed: one teacher forward pass (the part
that is shared) against one bridge step.

Times are process CPU seconds (one thread: robust to other jobs on a shared machine) and wall seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report, table, target  # noqa: E402


def _timed(fn):
    """``(result, cpu_s, wall_s)`` of ``fn()``."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = fn()
    return result, time.process_time() - cpu, time.perf_counter() - wall


def _teacher_cpu_s(model: str, batch_size: int, seq_len: int, repeats: int = 5) -> float:
    """Process CPU seconds of one teacher forward pass (``backbone_targets``) on a training batch."""
    import torch

    from dihal_fast.common.hf_loading import load_causal_lm, resolve_model_dir
    from dihal_fast.hybrid import backbone_targets

    backbone, _ = load_causal_lm(resolve_model_dir(model))
    ids = torch.randint(
        0, backbone.config.vocab_size, (batch_size, seq_len), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        backbone_targets(backbone, ids, 1)
        _, cpu_s, _ = _timed(lambda: [backbone_targets(backbone, ids, 1) for _ in range(repeats)])
    return cpu_s / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="tiny-qwen3-16l", help="shipped backbone name or checkpoint directory")
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 8, 15], help="candidate layers")
    parser.add_argument("--budget-steps", type=int, default=20, help="bridge steps per layer")
    parser.add_argument("--out", default="runs/sweep_speed", help="scratch run directory (emptied first)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    if args.budget_steps < 1 or len(args.layers) < 2:
        parser.error("--budget-steps must be >= 1 and --layers must name at least two layers")

    import torch

    from dihal_fast.common.assets import corpus_or_default
    from dihal_fast.pipeline.sweep_stage import SweepConfig, sweep_bridges
    from dihal_fast.replace import train_bridge

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    corpus = corpus_or_default(None)
    config = dataclasses.replace(SweepConfig().train_config(), steps=args.budget_steps)
    layers, steps = list(dict.fromkeys(args.layers)), len(dict.fromkeys(args.layers)) * args.budget_steps

    def separate() -> dict[int, dict]:
        return {
            layer: train_bridge(args.model, layer, corpus, out / "separate" / f"layer_{layer:02d}", config, resume=True)
            for layer in layers
        }

    before, before_cpu, before_wall = _timed(separate)
    after, after_cpu, after_wall = _timed(lambda: sweep_bridges(out / "together", args.model, layers, corpus, config))
    same = all(before[layer]["bridge_loss"] == after[layer]["bridge_loss"] for layer in layers)
    teacher_cpu = _teacher_cpu_s(args.model, config.batch_size, config.seq_len)
    step_cpu = before_cpu / steps

    rows = [
        ["one train_bridge per layer (before)", before_cpu, before_wall, before_cpu / steps, before_wall / steps],
        ["layers trained together (after)", after_cpu, after_wall, after_cpu / steps, after_wall / steps],
    ]
    loss_rows = [[layer, before[layer]["bridge_loss"], after[layer]["bridge_loss"]] for layer in layers]
    body = (
        f"Backbone `{args.model}`, layers {layers}, {args.budget_steps} bridge steps per layer (the sweep's "
        f"defaults otherwise: batch {config.batch_size} x {config.seq_len} tokens, {config.val_blocks} validation "
        f"blocks, {config.stats_blocks} statistics blocks), {args.threads} torch thread(s):\n\n"
        + table(["sweep bridges", "CPU s", "wall s", "CPU s / layer-step", "wall s / layer-step"], rows)
        + f"\n\nCPU speed-up {before_cpu / after_cpu:.2f}x. One teacher forward pass (batch "
        f"{config.batch_size} x {config.seq_len}) takes {teacher_cpu:.3f} CPU s, {teacher_cpu / step_cpu:.0%} of "
        f"a layer-step before.\n\n" + table(["layer", "bridge loss (before)", "bridge loss (after)"], loss_rows)
    )
    report(
        f"Sweep bridge training per layer-step on {Path(args.model).name} (bench_sweep_speed.py)",
        body,
        question="sweep_speed",
        figures={
            "before_cpu_s": before_cpu,
            "before_wall_s": before_wall,
            "after_cpu_s": after_cpu,
            "after_wall_s": after_wall,
            "layer_steps": steps,
            "before_cpu_s_per_layer_step": before_cpu / steps,
            "after_cpu_s_per_layer_step": after_cpu / steps,
            "teacher_forward_cpu_s": teacher_cpu,
            "bridge_losses": {
                str(layer): [before[layer]["bridge_loss"], after[layer]["bridge_loss"]] for layer in layers
            },
        },
        targets=[
            target("the same bridge loss per layer before and after", "identical" if same else "differ", same),
            target("CPU time per layer-step lower after", f"{before_cpu / after_cpu:.2f}x", after_cpu < before_cpu),
        ],
    )
    if not same:
        raise SystemExit("the bridge losses differ between the two ways of training: see the table above")


if __name__ == "__main__":
    main()
