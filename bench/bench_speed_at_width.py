"""How fast are the bridge's training step and the hybrid's generation at a real model's width?

On the rehearsal's random-weight checkpoints (``bench/make_rehearsal_model.py``: Llama-3.2-1B's and Qwen3-0.6B's
shapes), for each shape and backbone dtype, on one thread, in CPU seconds (the figure a shared machine's load
does not enter), FLOPs counted by torch's FlopCounterMode:

* one bridge training step at ``l = 2`` on the rehearsal's batch (8 blocks of 128 tokens; teacher targets, the
  objective's forward and backward, ``dihal replace``'s optimizer)
  against the one-thread GEMM rate of float32 and bfloat16 measured in the same process, and against its
  roofline: the bridge's FLOPs at the float32 rate (it trains in float32) and the rest at the backbone dtype's;
* the hybrid's prefill (``generate`` of one token after a 64-token prompt) and per-token decode (``generate`` of
  16 tokens minus that, over 15) against the backbone's own, best of 3 rounds with the models interleaved; for a
  bfloat16 backbone also the hybrid with ``bridge_dtype="auto"`` (the bridge in bfloat16).

Each (shape, dtype) result is kept in ``WORK/<shape>_<dtype>.json`` and reused; the record is written from all of
them.

    python bench/make_rehearsal_model.py --out /work/runs/rehearsal/models llama-1b qwen3-0.6b
    python bench/bench_speed_at_width.py --models /work/runs/rehearsal/models --work /work/runs/rehearsal/speed
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _common import add_rehearsal_options, best_time, cpu_seconds, gemm_rates, report, rows_figure, table, target

from dihal_fast.profiling import nvtx_range

DTYPES = ("float32", "bfloat16")
LAYER = 2  # the cut: two replaced layers, as the rehearsal's replace
GOALS = {"step": 0.50, "tokens": 0.95}  # share of the roofline; hybrid tokens/s over the backbone's


def step_figures(backbone, hybrid, dtype: str, batch: int, seq: int) -> dict:
    """One bridge training step on ``batch`` blocks of ``seq`` tokens (with ``dihal replace``'s optimizer): its
    FLOPs (total and the bridge's), best CPU seconds of 2, and its roofline share."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from dihal_fast.hybrid import backbone_targets
    from dihal_fast.replace.config import BridgeTrainConfig
    from dihal_fast.replace.objective import BridgeObjective
    from dihal_fast.train.engines import make_optimizer, trainable_parameters

    config = BridgeTrainConfig()
    objective = BridgeObjective(hybrid, config)
    optimizer, _ = make_optimizer(trainable_parameters(objective), config.loop_settings("cpu"))  # replace's own
    ids = torch.randint(3, backbone.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    randoms = objective.random_inputs(*ids.shape, torch.Generator().manual_seed(1))

    def step() -> None:
        hidden, teacher_logits = backbone_targets(backbone, ids, LAYER)
        objective(ids, hidden, teacher_logits, **randoms)["loss"].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: allocates the optimizer's moments
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    flops = counter.get_total_flops()
    bridge_flops = sum(counter.get_flop_counts()[f"{type(objective).__name__}.hybrid.bridge"].values())
    with nvtx_range("bridge step"):
        seconds = best_time(step, repeat=2, warmup=0, clock=time.process_time)
    rates = gemm_rates(backbone.config.hidden_size)  # in this process, beside the step
    roofline = (bridge_flops / rates["float32"] + (flops - bridge_flops) / rates[dtype]) / 1e9
    return {"step_flops": flops, "step_bridge_flops": bridge_flops, "step_cpu_s": seconds,
            "step_gflops": flops / seconds / 1e9, "gemm_gflops": rates,
            "step_roofline_share": roofline / seconds}  # fmt: skip


def generation_figures(models: dict, prompt, new_tokens: int) -> dict:
    """Prefill tokens and decoded tokens per CPU-second of each model through ``generate``, best of 3 rounds."""
    import torch

    def generate(lm, count: int) -> None:
        lm.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=count, min_new_tokens=count,
                    do_sample=False)  # fmt: skip

    times: dict[str, dict[str, list[float]]] = {name: {"prefill": [], "decode": []} for name in models}
    with torch.inference_mode():
        for lm in models.values():
            generate(lm, new_tokens)  # warm-up
        for _ in range(3):
            for name, lm in models.items():
                with nvtx_range(f"generate {name}"):
                    one = cpu_seconds(lambda lm=lm: generate(lm, 1))
                    whole = cpu_seconds(lambda lm=lm: generate(lm, new_tokens))
                times[name]["prefill"].append(one)
                times[name]["decode"].append((whole - one) / (new_tokens - 1))
    figures = {}
    for name in models:
        figures[f"{name}_prefill_tokens_per_cpu_s"] = prompt.shape[1] / min(times[name]["prefill"])
        figures[f"{name}_decode_tokens_per_cpu_s"] = 1 / max(min(times[name]["decode"]), 1e-9)
        figures[f"{name}_decode_cpu_s_rounds"] = times[name]["decode"]
    return figures


def measure(model: Path, dtype: str, batch: int = 8, seq: int = 128, new_tokens: int = 16) -> dict:
    """Every figure of one shape with its backbone in ``dtype``; the hybrid is an untrained cut at ``LAYER`` (speed
    does not depend on the weights)."""
    import torch

    from dihal_fast.common.hf_loading import load_causal_lm
    from dihal_fast.hybrid import HybridLM

    torch.set_num_threads(1)
    backbone, tokenizer = load_causal_lm(model, dtype)
    hybrid = HybridLM.from_backbone(backbone, LAYER, {}, tokenizer).eval()
    figures = {"dtype": dtype, "hidden": backbone.config.hidden_size, "layers": backbone.config.num_hidden_layers,
               "bridge_params": sum(p.numel() for p in hybrid.bridge.parameters()), "new_tokens": new_tokens,
               "batch": batch, "seq": seq, **step_figures(backbone, hybrid, dtype, batch, seq)}  # fmt: skip
    models = {"backbone": backbone, "hybrid": hybrid}
    if dtype != "float32":  # the same bridge in the backbone's dtype (HybridConfig.bridge_dtype = "auto")
        narrow = HybridLM.from_backbone(backbone, LAYER, {}, tokenizer).eval()
        narrow.bridge.load_state_dict(hybrid.bridge.state_dict())
        narrow.use_bridge_dtype("auto")
        models["hybrid_bridge_auto"] = narrow
    prompt = torch.randint(3, backbone.config.vocab_size, (1, seq // 2), generator=torch.Generator().manual_seed(2))
    return {**figures, **generation_figures(models, prompt, new_tokens)}


def write_record(results: dict[str, dict]) -> None:
    """The record from every measured (shape, dtype)."""
    header = ["shape", "backbone dtype", "bridge", "step GFLOP/CPU-s", "step / roofline", "step / dtype's GEMM",
              "backbone decode tokens/CPU-s", "prefill hybrid / backbone", "decode hybrid / backbone"]  # fmt: skip
    rows, targets = [], []
    for key, r in results.items():
        shape = key.rsplit("_", 1)[0]
        rate = r["gemm_gflops"][r["dtype"]]
        bridges = ["hybrid"] + (["hybrid_bridge_auto"] if "hybrid_bridge_auto_decode_tokens_per_cpu_s" in r else [])
        for name in bridges:
            prefill = r[f"{name}_prefill_tokens_per_cpu_s"] / r["backbone_prefill_tokens_per_cpu_s"]
            decode = r[f"{name}_decode_tokens_per_cpu_s"] / r["backbone_decode_tokens_per_cpu_s"]
            trained = name == "hybrid"
            rows.append([
                shape, r["dtype"], "float32" if trained else f"{r['dtype']} (auto)",
                f"{r['step_gflops']:.1f}" if trained else "", f"{r['step_roofline_share']:.0%}" if trained else "",
                f"{r['step_gflops'] / rate:.0%} of {rate:.0f}" if trained else "",
                f"{r['backbone_decode_tokens_per_cpu_s']:.2f}", f"{prefill:.2f}", f"{decode:.2f}",
            ])  # fmt: skip
        best = bridges[-1]
        worst = min(r[f"{best}_{kind}_tokens_per_cpu_s"] / r[f"backbone_{kind}_tokens_per_cpu_s"]
                    for kind in ("prefill", "decode"))  # fmt: skip
        bridge = "float32 bridge" if best == "hybrid" else "bridge_dtype auto"
        targets.append(
            target(
                f"{shape} {r['dtype']}: hybrid tokens/s >= {GOALS['tokens']} x the backbone's ({bridge})",
                f"{worst:.2f} (the lower of prefill and decode)",
                worst >= GOALS["tokens"],
            )
        )
        share = r["step_roofline_share"]
        targets.append(
            target(
                f"{shape} {r['dtype']}: bridge step >= {GOALS['step']:.0%} of its roofline",
                f"{share:.0%}",
                share >= GOALS["step"],
            )
        )
    text = (
        "Speed at width, random weights (bench/make_rehearsal_model.py), untrained cut at layer 2; one thread, CPU "
        "seconds, FLOPs counted by torch; the step on 8 blocks of 128 tokens, prompts of 64 tokens. The step's "
        "roofline: the bridge's FLOPs at the one-thread float32 GEMM "
        "rate (it trains in float32), the rest (teacher, retained layers, head) at the backbone dtype's; both "
        "rates measured in the same process.\n\n" + table(header, rows)
    )
    report("Bridge step and hybrid generation at a real model's width", text, question="speed_at_width",
           figures={"results": results, "table": rows_figure(header, rows)}, targets=targets)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_rehearsal_options(parser)
    parser.add_argument("--work", type=Path, required=True, help="where each shape's figures are kept")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--redo", action="store_true", help="measure again what WORK already holds")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    results = {}
    for shape in args.shapes:
        for dtype in args.dtypes:
            path = args.work / f"{shape}_{dtype}.json"
            if args.redo or not path.is_file():
                path.write_text(json.dumps(measure(args.models / shape, dtype), indent=1))
            results[f"{shape}_{dtype}"] = json.loads(path.read_text())
    write_record(results)


if __name__ == "__main__":
    main()
