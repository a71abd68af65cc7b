"""The paper's layer tables on each shipped backbone (DiHAL Tables 1, 2 and 4, at this scale).

Per backbone (``--model``, a shipped name or a checkpoint directory):

1. **Sweep** (``dihal sweep``, the sweep's protocol): locate with repeated score runs, one bridge per
   candidate layer with one fixed budget; Spearman / Kendall / Pearson of score vs -bridge loss (mean +-
   std over the score runs), the rank gap, and per layer the score, the validation bridge loss, the
   hybrid's validation PPL and KL, and the rank of each.
2. **Table 1**: the geometry-selected layer against the best and worst layer of the sweep, the shallowest
   and the deepest, all under that same budget.
3. **Table 4** (unless ``--skip-final``): the geometry layer, the oracle layer (lowest bridge loss of the
   sweep) and the worst layer, each trained for ``--final-steps`` and evaluated with ``dihal evaluate``'s
   harness (NLL / PPL / KL against the backbone on held-out blocks, Gen PPL under the evaluator LM,
   diversity). Its held-out blocks are the bridge's validation tail, never trained on.

All text is held out from every backbone's training: the shipped corpus (the Gutenberg book tails and the
2003-2006 State of the Union addresses, i.e. ``gutenberg_nltk.valid.txt`` + ``state_union.valid.txt``).
Every stage reuses what ``--out`` already holds, so an interrupted run continues. Each backbone's
figures become the record ``layer_tables_<name>`` and its geometry plot ``bench/results/geometry_<name>.png``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, markdown_tables, report, table, target  # noqa: E402

SHIPPED = ("tiny-llama-8l", "tiny-qwen3-16l")
FINAL_SEQ_LEN, FINAL_VAL_BLOCKS = 128, 32  # Table 4: the demo's held-out tail (32 blocks of 128 tokens)


def main() -> None:
    from dihal_fast.pipeline import SweepBudgetConfig

    defaults = SweepBudgetConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument(
        "--model", nargs="+", default=list(SHIPPED), help="shipped backbone names or checkpoint directories"
    )
    parser.add_argument(
        "--out", default="runs/layer_tables", help="run directory (one sub-folder per backbone; reused)"
    )
    parser.add_argument("--budget-steps", type=int, default=defaults.budget_steps, help="sweep: bridge steps per layer")
    parser.add_argument("--score-repeats", type=int, default=defaults.score_repeats, help="sweep: repeated score runs")
    parser.add_argument("--final-steps", type=int, default=600, help="Table 4: bridge steps of each final hybrid")
    parser.add_argument("--n-samples", type=int, default=16, help="Table 4: samples per model (Gen PPL, diversity)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="Table 4: tokens per sample")
    parser.add_argument("--skip-final", action="store_true", help="only the sweep and Table 1")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    parser.add_argument(
        "--train-layers",
        type=int,
        nargs="+",
        default=None,
        metavar="L",
        help="only train these layers' sweep bridges and exit (split one sweep over processes: "
        "the full run reuses them)",
    )
    args = parser.parse_args()
    if args.budget_steps < 1 or args.final_steps < 1 or args.score_repeats < 2:
        parser.error("--budget-steps and --final-steps must be >= 1, --score-repeats >= 2")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    for model in args.model:
        out = Path(args.out) / Path(model).name
        if args.train_layers:
            _train_sweep_layers(model, out / "sweep", args)
        else:
            backbone_tables(model, out, args)


def _train_sweep_layers(model: str, out: Path, args: argparse.Namespace) -> None:
    """The sweep's bridges of ``--train-layers``, exactly as ``dihal sweep`` trains them (it reuses them)."""
    from dihal_fast.common.assets import corpus_or_default
    from dihal_fast.pipeline import SweepBudgetConfig
    from dihal_fast.pipeline.sweep_stage import sweep_bridges

    config = SweepBudgetConfig(budget_steps=args.budget_steps, score_repeats=args.score_repeats).train_config()
    sweep_bridges(out, model, list(args.train_layers), corpus_or_default(None), config)


def backbone_tables(model: str, out: Path, args: argparse.Namespace) -> None:
    """The sweep, Table 1 and (unless skipped) Table 4 of one backbone, reported as one record."""
    import torch

    from dihal_fast.backbone.corpus import sha256_file
    from dihal_fast.common import read_json
    from dihal_fast.common.assets import corpus_or_default
    from dihal_fast.common.hf_loading import resolve_model_dir
    from dihal_fast.pipeline import SweepBudgetConfig, SweepConfig
    from dihal_fast.pipeline import sweep as run_sweep

    model_dir = resolve_model_dir(model)
    corpus = corpus_or_default(None)
    settings = SweepBudgetConfig(budget_steps=args.budget_steps, score_repeats=args.score_repeats)
    start = time.perf_counter()
    sweep = dict(run_sweep(SweepConfig(model=model, corpus=corpus, settings=settings), out / "sweep").data)
    sweep_s = time.perf_counter() - start
    layers = _layer_rows(sweep, read_json)
    compute_s = _sweep_compute_s(out / "sweep", layers, read_json)
    by_layer = {row["layer"]: row for row in layers}
    geometry = sweep["selected_layer"]
    ordered = sorted(layers, key=lambda r: r["bridge_loss"])
    oracle, worst = ordered[0]["layer"], ordered[-1]["layer"]
    roles = [
        ("geometry (l*)", geometry),
        ("best (oracle)", oracle),
        ("worst", worst),
        ("shallowest", min(by_layer)),
        ("deepest", max(by_layer)),
    ]
    n = len(layers)
    backbone_ppl = layers[0]["backbone_ppl"]

    sweep_rows = [
        [
            r["layer"],
            r["score"],
            r["score_std"],
            r["score_rank"],
            r["bridge_loss"],
            r["loss_rank"],
            r["hybrid_ppl"],
            r["kl"],
        ]
        for r in layers
    ]
    corr_rows = [
        [name, sweep[name]["mean"], sweep[name]["std"], sweep[name]["n_runs"]]
        for name in ("spearman", "kendall", "pearson")
    ]
    table1 = [
        [
            role,
            layer,
            by_layer[layer]["score"],
            f"{by_layer[layer]['score_rank']}/{n}",
            by_layer[layer]["bridge_loss"],
            f"{by_layer[layer]['loss_rank']}/{n}",
            by_layer[layer]["hybrid_ppl"],
            by_layer[layer]["hybrid_ppl"] / backbone_ppl,
            by_layer[layer]["kl"],
        ]
        for role, layer in roles
    ]
    rho = sweep["spearman"]["mean"]
    geometry_rank = by_layer[geometry]["loss_rank"]
    targets = [
        [
            "Spearman(score, -bridge loss) >= 0.9 (sweep protocol, held-out text)",
            "n/a" if rho is None else f"{rho:.3f} +- {sweep['spearman']['std']:.3f}",
            None if rho is None else rho >= 0.9,
        ],
        [
            "geometry layer within the best three of the sweep",
            f"layer {geometry}: loss rank {geometry_rank} of {n}",
            geometry_rank <= 3,
        ],
    ]
    sections = [
        (
            f"Backbone `{Path(model).name}` (`{model_dir}`), {n} candidate layers; held-out text: the shipped corpus "
            f"(`gutenberg_nltk.valid.txt` + `state_union.valid.txt`, never seen by either backbone). Sweep: "
            f"{settings.budget_steps} bridge steps per layer (batch {settings.batch_size} x {settings.seq_len} tokens, "
            f"validation on the last {settings.val_blocks} blocks of the corpus), scores from "
            f"{settings.score_repeats} runs "
            f"of {settings.score_sample} tokens; torch threads {torch.get_num_threads()}; sweep {sweep_s:.0f} s "
            f"of wall time in this run (stages reused from an earlier run take no time; locate + bridge training took "
            f"{compute_s:.0f} s when they ran). Backbone PPL on the sweep's validation blocks "
            f"{backbone_ppl:.2f}."
        ),
        "**Sweep** (ranks: 1 = highest score / lowest loss):\n\n"
        + table(
            ["layer", "score (mean)", "score std", "score rank", "bridge loss", "loss rank", "hybrid PPL", "KL"],
            sweep_rows,
        ),
        table(["correlation", "mean", "std", "runs"], corr_rows)
        + f"\n\nrank gap {sweep['rank_gap']} (best score: layer {sweep['predicted_layer']}, lowest loss: layer "
        f"{sweep['observed_best_layer']}); layer gap {sweep['layer_gap']}.",
        f"**Table 1** (same budget, {settings.budget_steps} steps per layer):\n\n"
        + table(
            [
                "layer role",
                "layer",
                "score",
                "score rank",
                "bridge loss",
                "loss rank",
                "hybrid PPL",
                "PPL / backbone",
                "KL",
            ],
            table1,
        ),
    ]
    figures: dict = {
        "backbone_sha256": sha256_file(model_dir / "model.safetensors"),  # which weights the tables are of
        "sweep_s": sweep_s,
        "sweep_compute_s": compute_s,
        "selected_layer": geometry,
        "oracle_layer": oracle,
        "worst_layer": worst,
        "rank_gap": sweep["rank_gap"],
        "n_layers": n,
        "backbone_ppl": backbone_ppl,
    }
    names = ["sweep_layers", "correlations", "table1"]
    if not args.skip_final:
        final_rows, final_figures, final_target = _final_table(
            model, corpus, out / "final", geometry, oracle, worst, args
        )
        sections.append(final_rows)
        figures.update(final_figures)
        targets.append(final_target)
        names.append("table4")
    body = "\n\n".join(
        sections
        + [
            table(
                ["target", "measured", "status"],
                [[t, m, "met" if s else ("missed" if s is not None else "reported")] for t, m, s in targets],
            )
        ]
    )
    names.append("targets")
    name = Path(model).name
    geometry_png = out / "sweep" / "locate" / "geometry.png"
    if geometry_png.is_file():
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(geometry_png, RESULTS_DIR / f"geometry_{name}.png")
    report(
        f"Layer tables on {name} (bench_layer_tables.py)",
        body,
        question=f"layer_tables_{name.replace('-', '_')}",
        figures={**dict(zip(names, markdown_tables(body))), **figures},
        targets=[target(t, m, s) for t, m, s in targets],
    )


def _sweep_compute_s(sweep_dir: Path, layers: list[dict], read_json) -> float:
    """Seconds the sweep's stages took when they ran (locate + every layer's bridge training), whichever
    invocation ran them: a rerun that reuses them takes almost no wall time of its own."""
    locate = read_json(sweep_dir / "locate" / "locate.json", "locate report")["timings"]["total_s"]
    return locate + sum(
        read_json(Path(row["hybrid_dir"]).parent / "result.json", "bridge training summary")["train_seconds_this_run"]
        for row in layers
    )


def _layer_rows(sweep: dict, read_json) -> list[dict]:
    """The sweep's rows with each layer's validation PPL / KL and the score and loss ranks (1 = best)."""
    rows = []
    for row in sweep["layers"]:
        validation = read_json(Path(row["hybrid_dir"]).parent / "result.json", "bridge training summary")["validation"]
        rows.append(
            {
                **row,
                "hybrid_ppl": validation["hybrid_ppl"],
                "backbone_ppl": validation["backbone_ppl"],
                "kl": validation["kl"],
            }
        )
    by_score = sorted(rows, key=lambda r: -r["score"])
    by_loss = sorted(rows, key=lambda r: r["bridge_loss"])
    for row in rows:
        row["score_rank"] = by_score.index(row) + 1
        row["loss_rank"] = by_loss.index(row) + 1
    return rows


def _final_table(
    model: str, corpus: list[str], out: Path, geometry: int, oracle: int, worst: int, args: argparse.Namespace
) -> tuple[str, dict, list]:
    """Table 4: the geometry, oracle and worst layers trained for ``--final-steps`` and evaluated together."""
    from dihal_fast.common import seed_everything
    from dihal_fast.common.hf_loading import resolve_model_dir
    from dihal_fast.common.rundir import run_directory
    from dihal_fast.evaluate.harness import EvalProtocolConfig
    from dihal_fast.evaluate.models import resolve_models
    from dihal_fast.evaluate.run import evaluate_hybrid
    from dihal_fast.pipeline.reuse import ensure_replace
    from dihal_fast.replace.config import BridgeTrainConfig

    config = BridgeTrainConfig(steps=args.final_steps, seq_len=FINAL_SEQ_LEN, val_blocks=FINAL_VAL_BLOCKS, seed=0)
    start = time.perf_counter()
    trained = {
        layer: ensure_replace(out / f"layer_{layer:02d}", model, layer, corpus, config)
        for layer in dict.fromkeys((geometry, oracle, worst))
    }
    hybrids = {layer: result["hybrid_dir"] for layer, result in trained.items()}
    train_s = sum(result["train_seconds_this_run"] for result in trained.values())
    settings = EvalProtocolConfig(
        seq_len=FINAL_SEQ_LEN,
        eval_blocks=FINAL_VAL_BLOCKS,
        n_samples=args.n_samples,
        max_new_tokens=args.max_new_tokens,
    )
    controls = {f"layer {layer}": hybrids[layer] for layer in hybrids if layer != geometry}
    seed_everything(settings.seed)
    with run_directory(out / "evaluate", "bench_layer_tables evaluate"):
        evaluator = resolve_model_dir(None)  # tiny-llama-8l for both backbones, as the records were made
        models = resolve_models(hybrids[geometry], resolve_model_dir(model), evaluator, controls=controls)
        evaluation = evaluate_hybrid(models, corpus, out / "evaluate", settings)
    final_s = time.perf_counter() - start
    roles: dict[int, list[str]] = {}
    for layer, role in ((geometry, "geometry (l*)"), (oracle, "oracle"), (worst, "worst")):
        roles.setdefault(layer, []).append(role)
    columns = {
        "backbone": evaluation["backbone"],
        **{
            f"{' = '.join(roles[layer])} (layer {layer})": evaluation["hybrid"]
            if layer == geometry
            else evaluation["controls"][f"layer {layer}"]
            for layer in hybrids
        },
    }
    metrics = ("nll", "ppl", "kl", "gen_ppl", "entropy", "diversity_dihal", "diversity_ld4lg", "tokens_per_s")
    rows = [[m, *("n/a" if c.get(m) is None else c[m] for c in columns.values())] for m in metrics]
    geometry_ppl = evaluation["hybrid"]["ppl"]
    oracle_ppl = geometry_ppl if oracle == geometry else evaluation["controls"][f"layer {oracle}"]["ppl"]
    gap = geometry_ppl / oracle_ppl - 1
    text = (
        f"**Table 4** (each hybrid trained for {args.final_steps} bridge steps, batch {config.batch_size} x "
        f"{FINAL_SEQ_LEN}; evaluated on the last {FINAL_VAL_BLOCKS} blocks of {FINAL_SEQ_LEN} tokens of the shipped "
        f"corpus, the tail held out from bridge training; {args.n_samples} samples of {args.max_new_tokens} tokens, "
        f"Gen PPL under the evaluator `{evaluation['evaluator']['path']}` (tiny-llama-8l for both backbones); "
        f"{final_s:.0f} s of wall time in this run; the hybrids' training took {train_s:.0f} s when it ran):\n\n"
        + table(["metric", *columns], rows)
    )
    final_target = [
        "geometry layer's trained hybrid within 5 % of the oracle layer's PPL",
        f"{geometry_ppl:.2f} vs {oracle_ppl:.2f} ({gap:+.1%})",
        gap <= 0.05,
    ]
    return (
        text,
        {
            "final_s": final_s,
            "final_train_s": train_s,
            "final_geometry_ppl": geometry_ppl,
            "final_oracle_ppl": oracle_ppl,
        },
        final_target,
    )


if __name__ == "__main__":
    main()
