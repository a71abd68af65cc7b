"""Does the pipeline meet the paper-level targets on the shipped backbone?

1. ``dihal sweep``: locate with 30 repeated 500-token score runs, then a bridge per candidate layer with
   one fixed budget; Spearman / Kendall / Pearson of score vs -bridge loss (mean +- std over the runs),
   rank gap. Targets: Spearman >= 0.8; the selected layer's bridge loss in the best third.
2. ``dihal evaluate`` of the selected layer's hybrid against the backbone, with the oracle and worst layers
   of the sweep and the Diffusion-LM-like control (same budget) as controls. Targets: hybrid PPL within
   1.25x of the backbone; hybrid tokens/s reported against the backbone's.

Every stage reuses what ``--out`` already holds, so an interrupted run continues.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_tables, report, table, target  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", default="runs/bench_pipeline", help="run directory (reused between runs)")
    parser.add_argument("--model", default=None, help="backbone checkpoint (default: the shipped backbone)")
    parser.add_argument("--corpus", nargs="+", default=None, help="corpus (default: the shipped corpus)")
    parser.add_argument("--budget-steps", type=int, default=150, help="bridge training steps per layer")
    parser.add_argument("--score-repeats", type=int, default=30, help="repeated score runs")
    parser.add_argument("--score-sample", type=int, default=500, help="tokens per score run")
    parser.add_argument("--max-tokens", type=int, default=32768, help="tokens locate reads")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per block (locate, training, evaluation)")
    parser.add_argument(
        "--val-blocks", type=int, default=16, help="held-out corpus-tail blocks (bridge loss, evaluation)"
    )
    parser.add_argument("--n-samples", type=int, default=16, help="samples per model")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per sample")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    parser.add_argument("--no-controls", action="store_true", help="evaluate only the selected layer and the backbone")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from dihal_fast.common.assets import corpus_or_default
    from dihal_fast.evaluate.harness import EvalProtocolConfig
    from dihal_fast.pipeline import EvaluateConfig, SweepBudgetConfig, SweepConfig, evaluate
    from dihal_fast.pipeline import sweep as run_sweep

    corpus = corpus_or_default(args.corpus)
    out = Path(args.out)
    settings = SweepBudgetConfig(
        budget_steps=args.budget_steps,
        score_repeats=args.score_repeats,
        score_sample=args.score_sample,
        max_tokens=args.max_tokens,
        seq_len=args.seq_len,
        val_blocks=args.val_blocks,
    )
    start = time.perf_counter()
    sweep = run_sweep(SweepConfig(model=args.model, corpus=corpus, settings=settings), out / "sweep")
    sweep_s = time.perf_counter() - start
    selected = next(r for r in sweep["layers"] if r["layer"] == sweep["selected_layer"])
    evaluation = evaluate(
        EvaluateConfig(
            hybrid=selected["hybrid_dir"],
            corpus=corpus,
            evaluator=args.model,
            sweep=None if args.no_controls else str(out / "sweep"),
            diffusion_lm_steps=0 if args.no_controls else args.budget_steps,
            settings=EvalProtocolConfig(
                seq_len=settings.seq_len,
                eval_blocks=settings.val_blocks,
                n_samples=args.n_samples,
                max_new_tokens=args.max_new_tokens,
            ),
        ),
        out / "evaluate",
    )
    speed_rows = _speed_by_nfe(selected["hybrid_dir"], args.model, args.n_samples, args.max_new_tokens)
    total_s = time.perf_counter() - start

    losses = sorted(r["bridge_loss"] for r in sweep["layers"])
    layer_rows = [
        [r["layer"], r["score"], r["score_std"], r["bridge_loss"], losses.index(r["bridge_loss"]) + 1]
        for r in sweep["layers"]
    ]
    corr = [
        [name, sweep[name]["mean"], sweep[name]["std"], sweep[name]["n_runs"]]
        for name in ("spearman", "kendall", "pearson")
    ]
    columns = {
        "backbone": evaluation["backbone"],
        f"hybrid (layer {selected['layer']})": evaluation["hybrid"],
        **evaluation["controls"],
    }
    metrics = ("nll", "ppl", "kl", "gen_ppl", "entropy", "diversity_dihal", "diversity_ld4lg", "tokens_per_s")
    metric_rows = [[m, *("n/a" if c.get(m) is None else c[m] for c in columns.values())] for m in metrics]
    ppl_ratio = evaluation["hybrid"]["ppl"] / evaluation["backbone"]["ppl"]
    speed_ratio = evaluation["hybrid"]["tokens_per_s"] / evaluation["backbone"]["tokens_per_s"]
    rank = losses.index(selected["bridge_loss"]) + 1
    rho = sweep["spearman"]["mean"]
    targets = [
        ["hybrid PPL / backbone PPL <= 1.25", f"{ppl_ratio:.3f}", "met" if ppl_ratio <= 1.25 else "missed"],
        [
            "Spearman(score, -bridge loss) >= 0.8",
            "n/a" if rho is None else f"{rho:.3f}",
            "met" if rho is not None and rho >= 0.8 else "missed",
        ],
        [
            "selected layer's bridge loss in the best third",
            f"rank {rank} of {len(losses)}",
            "met" if sweep["selected_in_best_third"] else "missed",
        ],
        ["hybrid tokens/s / backbone tokens/s", f"{speed_ratio:.3f}", "reported (> 1 = hybrid faster)"],
    ]
    body = "\n\n".join(
        [
            f"Backbone `{sweep['model']}`, corpus {', '.join(f'`{c}`' for c in corpus)}; {len(losses)} candidate "
            "layers, "
            f"{args.budget_steps} bridge steps each (batch {settings.batch_size} x {settings.seq_len} tokens); scores "
            "from "
            f"{args.score_repeats} runs of {args.score_sample} tokens; evaluation on {settings.val_blocks} held-out "
            "blocks, "
            f"{args.n_samples} samples of {args.max_new_tokens} tokens; torch threads {torch.get_num_threads()}; "
            f"sweep {sweep_s:.0f} s, total {total_s:.0f} s (stages reused from earlier runs take no time).",
            table(["layer", "score (mean)", "score std", "bridge loss", "loss rank"], layer_rows),
            table(["correlation", "mean", "std", "runs"], corr)
            + f"\n\nrank gap {sweep['rank_gap']} (best score: layer {sweep['predicted_layer']}, lowest loss: layer "
            f"{sweep['observed_best_layer']}).",
            table(["metric", *columns], metric_rows),
            table(["target", "measured", "status"], targets),
            "Generation speed against the number of bridge denoising steps (same batch of "
            f"{args.n_samples} x {args.max_new_tokens} tokens, median of 3):\n\n"
            + table(["model", "nfe", "tokens/s", "/ backbone"], speed_rows),
        ]
    )
    names = ["layers", "correlations", "evaluation", "targets", "speed_vs_nfe"]
    report(
        "DiHAL pipeline targets: layer sweep and evaluation (bench_pipeline.py)",
        body,
        question="pipeline_targets",
        figures={
            **dict(zip(names, markdown_tables(body))),
            "sweep_s": sweep_s,
            "total_s": total_s,
            "rank_gap": sweep["rank_gap"],
            "selected_layer": selected["layer"],
        },
        targets=[
            target(text, measured, {"met": True, "missed": False}.get(status)) for text, measured, status in targets
        ],
    )


def _speed_by_nfe(hybrid_dir: str, model: str | None, n_samples: int, new_tokens: int) -> list[list]:
    """Tokens/s of the backbone and of the hybrid at several nfe (median of 3 timed calls each)."""
    import statistics

    import torch

    from dihal_fast.common.metrics import tokens_per_second
    from dihal_fast.evaluate.loaded_lm import configure_bridge, load_lm

    def speed(lm, nfe):
        configure_bridge(lm.model, nfe)
        prompt = torch.tensor([lm.prompt_ids("")]).expand(n_samples, -1)
        runs = [lm.sample(prompt, new_tokens, generator=torch.Generator().manual_seed(i)) for i in range(3)]
        return statistics.median(tokens_per_second(g.tokens.numel(), g.seconds) for g in runs)

    backbone = speed(load_lm(model), None)
    hybrid = load_lm(hybrid_dir)
    rows = [["backbone", "-", backbone, 1.0]]
    for nfe in (1, 2, 4, 8):
        rate = speed(hybrid, nfe)
        rows.append(["hybrid", nfe, rate, rate / backbone])
    return rows


if __name__ == "__main__":
    main()
