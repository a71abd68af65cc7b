"""How fast does the hybrid sample through transformers' ``generate()``, against its backbone and against a bare loop?

The README's generation-speed figures: the shipped backbone and its layer-1 hybrid (``dihal replace --layer 1
--steps 300``, default bridge; trained into ``--work`` unless ``--hybrid`` names one), 16 unconditional samples of
64 tokens (the demo's protocol: float64 draws at temperature 1, no EOS stop), each model two ways, interleaved
over ``--rounds`` rounds, fastest call of each kept:

* ``generate``: :meth:`LoadedLM.sample`, i.e. ``model.generate(**float64_sampling(...))``, what ``dihal generate``
  and ``dihal evaluate`` run;
* bare loop: the loop ``generate()`` replaced, written out: one prefill, then one cached forward pass and one
  float64 draw (:func:`~dihal_fast.common.sampling.sample_categorical`) per token, nothing else.

Tokens/s as wall time and as the process's CPU time on one thread (the CPU-time ratio is the one a busy shared
machine distorts least); whether both ways draw the same tokens from the same generator seed is recorded too.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_hybrid_options, hybrid_from_options, report, rows_figure, table  # noqa: E402

from dihal_fast.common.sampling import sample_categorical  # noqa: E402
from dihal_fast.evaluate.loaded_lm import load_lm  # noqa: E402


@torch.inference_mode()
def bare_loop(model, prompt: torch.Tensor, tokens: int, generator: torch.Generator) -> torch.Tensor:
    """``tokens`` new ids per row of ``prompt`` by prefill + one cached forward and one float64 draw per token."""
    out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
    drawn = []
    for step in range(tokens):
        token = sample_categorical(out.logits[:, -1], 1.0, None, generator)
        drawn.append(token)
        if step + 1 < tokens:
            out = model(input_ids=token[:, None], cache=out.cache, use_cache=True, logits_to_keep=1)
    return torch.stack(drawn, dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_hybrid_options(parser, "runs/bench_generate_speed")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (fastest call kept)")
    parser.add_argument("--samples", type=int, default=16, help="samples per call")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per sample")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--backbone", help="the hybrid's backbone (default: the shipped one)")
    parser.add_argument("--question", default="generate_speed", help="the record to write (a real model's: its own)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    hybrid_dir = hybrid_from_options(args)
    models = {"backbone": load_lm(args.backbone, device="cpu"), "hybrid": load_lm(hybrid_dir, device="cpu")}
    prompt = torch.tensor([models["backbone"].prompt_ids("")]).expand(args.samples, -1)
    ways = {
        "generate": lambda lm, g: lm.sample(prompt, args.tokens, 1.0, None, g).tokens,
        "bare loop": lambda lm, g: bare_loop(lm.model, prompt, args.tokens, g),
    }
    best = {(m, w): (float("inf"), float("inf")) for m in models for w in ways}
    drawn: dict[tuple[str, str], torch.Tensor] = {}
    for _ in range(args.rounds):
        for model_name, lm in models.items():
            for way, run in ways.items():
                start_cpu, start = time.process_time(), time.perf_counter()
                drawn[model_name, way] = run(lm, torch.Generator().manual_seed(0))
                wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
                best[model_name, way] = (min(best[model_name, way][0], wall), min(best[model_name, way][1], cpu))
    count = args.samples * args.tokens
    rate = {key: (count / wall, count / cpu) for key, (wall, cpu) in best.items()}
    header = ["model", "way", "tokens/s (wall)", "tokens/s (CPU time)", "same tokens as generate"]
    rows = [
        [
            m,
            w,
            f"{rate[m, w][0]:.0f}",
            f"{rate[m, w][1]:.0f}",
            "yes" if torch.equal(drawn[m, w], drawn[m, "generate"]) else "no",
        ]
        for m in models
        for w in ways
    ]
    ratios = {
        "hybrid_vs_backbone_generate_wall": rate["hybrid", "generate"][0] / rate["backbone", "generate"][0],
        "hybrid_vs_backbone_generate_cpu": rate["hybrid", "generate"][1] / rate["backbone", "generate"][1],
        **{
            f"{m}_generate_vs_loop_{clock}": rate[m, "generate"][i] / rate[m, "bare loop"][i]
            for m in models
            for i, clock in enumerate(("wall", "cpu"))
        },
    }
    body = table(header, rows)
    body += (
        f"\n\nThe hybrid through `generate` at {ratios['hybrid_vs_backbone_generate_cpu']:.2f}x (CPU time) / "
        f"{ratios['hybrid_vs_backbone_generate_wall']:.2f}x (wall) the backbone's tokens/s; `generate` against the "
        f"bare loop: hybrid {ratios['hybrid_generate_vs_loop_cpu']:.2f}x (CPU) / "
        f"{ratios['hybrid_generate_vs_loop_wall']:.2f}x (wall), backbone {ratios['backbone_generate_vs_loop_cpu']:.2f}x"
        f" / {ratios['backbone_generate_vs_loop_wall']:.2f}x. {args.samples} samples x {args.tokens} tokens per call, "
        f"fastest of {args.rounds} interleaved rounds, torch threads {args.threads}; hybrid `{hybrid_dir}`."
    )
    report(
        "Generation speed: the hybrid through generate() against its backbone and a bare loop",
        body,
        question=args.question,
        figures={"speed": rows_figure(header, rows), **ratios},
    )


if __name__ == "__main__":
    main()
