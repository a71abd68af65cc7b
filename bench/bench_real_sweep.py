"""Does the selection score predict bridgeability on a real model? ``dihal sweep`` on SmolLM2-135M-Instruct: locate
with repeated score runs, one paper's bridge (everything learned from ``c(x)``) per candidate layer with one fixed
budget, the scores against the validation bridge losses (Spearman, Kendall, Pearson, rank gap).

The bridges train on their diffusion and reconstruction losses alone (``--w-lm 0 --w-kd 0``: with the next-token
and distillation terms at CPU budgets no bridge of this model gets below the mean predictor, and the sweep's
question is how well ``h_l`` is rebuilt); each layer's hybrid PPL ratio and KL on the corpus tail stand beside its
bridge loss. One thread (``--workers 1``); the sweep resumes after a kill (a rerun reuses finished layers).

    python bench/bench_real_sweep.py --layers 1 2 3 4 5 7 10 15 --budget-steps 100 \\
        --corpus ../shared/data/text/*.train.txt --work /work/runs/real_sweep
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from _common import BENCH, add_model_option, dihal_one_thread, real_model, report, rows_figure, table, target


def run_sweep(model: Path, args: argparse.Namespace, out: Path) -> dict:
    """``dihal sweep`` into ``out`` on one thread (resumed when ``out`` exists); its sweep.json."""
    dihal_one_thread(
        "sweep", "--model", str(model), "--corpus", *map(str, args.corpus), "--layers", *map(str, args.layers),
        "--budget-steps", str(args.budget_steps), "--w-lm", "0", "--w-kd", "0", "--workers", "1", "--out", str(out),
        *(["--resume"] if out.is_dir() else []),
    )  # fmt: skip
    return json.loads((out / "sweep.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 3, 4, 5, 7, 10, 15])
    parser.add_argument("--budget-steps", type=int, default=100, help="bridge training steps per layer")
    parser.add_argument("--corpus", type=Path, nargs="+", required=True)
    parser.add_argument("--work", type=Path, required=True, help="the sweep's run directory and the model cache")
    add_model_option(parser)
    parser.add_argument("--question", default="real_sweep_smollm2")
    args = parser.parse_args()
    out = args.work / "sweep"
    sweep = run_sweep(real_model(args), args, out)
    rows = []
    for row in sweep["layers"]:
        validation = json.loads((Path(row["hybrid_dir"]).parent / "result.json").read_text())["validation"]
        rows.append(
            [
                row["layer"],
                row["score"],
                row["score_std"],
                row["bridge_loss"],
                validation["ppl_ratio"],
                validation["kl"],
            ]
        )
    columns = ["layer", "score", "score_std", "bridge_loss", "ppl_ratio", "kl"]
    plot = BENCH / "results" / f"{args.question}.png"
    shutil.copyfile(out / "sweep.png", plot)
    summary = {k: sweep[k] for k in ("spearman", "kendall", "pearson", "rank_gap", "layer_gap")}
    chosen = {k: sweep[k] for k in ("selected_layer", "predicted_layer", "observed_best_layer")}
    lines = [f"- {name}: {json.dumps(value)}" for name, value in {**summary, **chosen}.items()]
    losses = sorted(r[3] for r in rows)
    selected_loss = next(r[3] for r in rows if r[0] == sweep["selected_layer"])
    rank = f"layer {sweep['selected_layer']}: loss rank {losses.index(selected_loss) + 1} of {len(rows)}"
    report(
        f"Layer sweep on SmolLM2-135M: {len(rows)} layers, {args.budget_steps} bridge steps each",
        table(columns, rows) + "\n\n" + "\n".join(lines) + f"\n\n![sweep](results/{plot.name})",
        question=args.question,
        figures={"layers": rows_figure(columns, rows), **summary, **chosen, "budget_steps": args.budget_steps},
        targets=[
            target("every bridge below the mean predictor (loss < 1)", f"worst {max(r[3] for r in rows):.3f}",
                   sweep["bridges_learned"] and max(r[3] for r in rows) < 1),
            target("the selected layer among the best third by bridge loss", rank,
                   sweep["selected_in_best_third"]),
            target("Spearman(score, bridge loss) reported", json.dumps(summary["spearman"]), None),
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main()
