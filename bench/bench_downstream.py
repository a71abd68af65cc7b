"""How does a hybrid do on downstream tasks against its backbone? The shipped offline tasks, lm-eval's HFLM.

The shipped backbone and its hybrid (``dihal replace`` defaults at layer 1, trained into ``--out`` unless
``--hybrid`` names one) on ``dihal_lambada_local`` (300 last-word predictions) and ``dihal_cloze_local``
(300 four-way next-sentence choices), zero-shot, through lm-evaluation-harness's own ``HFLM`` around each
loaded model (``dihal_fast.evaluate.downstream.run_tasks``); the hybrid scores with its deterministic
bridge noise. Per model: each metric ± the harness's standard error; per metric: the paired difference
hybrid - backbone on the same examples, ± its standard error (std of the per-example differences / sqrt n),
which is far tighter than the two errors together.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report, rows_figure, table, target  # noqa: E402

METRICS = {"dihal_lambada_local": ("acc", "perplexity"), "dihal_cloze_local": ("acc", "acc_norm", "acc_mutual_info")}
PAIRED = {"dihal_lambada_local": ("acc", "loglikelihood"), "dihal_cloze_local": ("acc", "acc_norm", "acc_mutual_info")}


def trained_hybrid(out: Path) -> Path:
    """The hybrid of a finished ``dihal replace --layer 1`` run with the defaults in ``out`` (trained if absent)."""
    from dihal_fast.pipeline import ReplaceConfig, replace

    if (out / "hybrid" / "config.json").is_file():
        return out / "hybrid"
    return Path(replace(ReplaceConfig(layer=1), out).hybrid_dir)


def paired(hybrid: list[float], backbone: list[float]) -> tuple[float, float]:
    """Mean and standard error of the per-example differences ``hybrid - backbone``."""
    diffs = [h - b for h, b in zip(hybrid, backbone, strict=True)]
    mean = sum(diffs) / len(diffs)
    var = sum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1)
    return mean, math.sqrt(var / len(diffs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", default="runs/bench_downstream", help="run directory of the hybrid's training (reused)"
    )
    parser.add_argument("--hybrid", help="an existing hybrid directory instead (its backbone: the recorded one)")
    parser.add_argument("--batch-size", type=int, default=16, help="HFLM batch size")
    parser.add_argument("--limit", type=int, help="first N examples per task (a trial run)")
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dihal_fast.evaluate import downstream

    tasks = list(METRICS)
    downstream.check_tasks(tasks)
    hybrid_dir = Path(args.hybrid) if args.hybrid else trained_hybrid(Path(args.out))
    hybrid = AutoModelForCausalLM.from_pretrained(hybrid_dir, trust_remote_code=True)
    backbone_dir = Path(hybrid.config.backbone_dir)
    models = {
        "backbone": (AutoModelForCausalLM.from_pretrained(backbone_dir, dtype=torch.float32), backbone_dir),
        "hybrid": (hybrid, hybrid_dir),
    }
    results, seconds = {}, {}
    for name, (model, directory) in models.items():
        start, cpu = time.perf_counter(), time.process_time()
        results[name] = downstream.run_tasks(
            model.eval(),
            AutoTokenizer.from_pretrained(directory),
            tasks,
            batch_size=args.batch_size,
            limit=args.limit,
            per_example=True,
        )
        seconds[name] = (time.perf_counter() - start, time.process_time() - cpu)

    header = ["task", "metric", "backbone", "hybrid", "hybrid - backbone (paired)"]
    rows = []
    for task, metrics in METRICS.items():
        for metric in metrics:
            cells = [f"{results[m][task][metric]:.4g} ± {results[m][task][metric + '_stderr']:.2g}" for m in models]
            rows.append([task, metric, *cells, ""])
        for metric in PAIRED[task]:
            mean, err = paired(
                results["hybrid"][task]["per_example"][metric], results["backbone"][task]["per_example"][metric]
            )
            label = "target log-likelihood (nats)" if metric == "loglikelihood" else metric
            match = next((row for row in rows if row[0] == task and row[1] == metric), None)
            if match is not None:
                match[4] = f"{mean:+.4f} ± {err:.4f}"
            else:
                rows.append([task, label, "", "", f"{mean:+.4f} ± {err:.4f}"])
    n = {task: results["backbone"][task]["n"] for task in tasks}
    timing = ", ".join(f"{m} {w:.0f} s wall / {c:.0f} s CPU" for m, (w, c) in seconds.items())
    body = (
        f"Backbone `{backbone_dir}`, hybrid `{hybrid_dir}` (layer {hybrid.config.layer}); examples {n}; "
        f"HFLM batch {args.batch_size}, float32, CPU; lm-eval {downstream.require_lm_eval().__version__}; "
        f"{timing}. Chance: cloze acc 0.25.\n\n" + table(header, rows)
    )
    worst = max(
        -paired(results["hybrid"][t]["per_example"]["acc"], results["backbone"][t]["per_example"]["acc"])[0]
        for t in tasks
    )
    report(
        "Downstream tasks: hybrid vs backbone",
        body,
        question="downstream_tasks",
        figures={
            "table": rows_figure(header, rows),
            "examples": n,
            "seconds": seconds,
            "results": {
                m: {t: {k: v for k, v in r.items() if k != "per_example"} for t, r in res.items()}
                for m, res in results.items()
            },
        },
        targets=[
            target(
                "hybrid task accuracy against its backbone (reported, no target set)",
                f"largest accuracy drop {worst:+.4f}",
                None,
            )
        ],
    )


if __name__ == "__main__":
    main()
