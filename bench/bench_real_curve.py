"""What does a training budget buy on a real model? The hybrid's held-out PPL ratio and KL against training tokens
and CPU seconds: SmolLM2-135M-Instruct (or ``--model``) at its selected layer, one ``dihal replace`` run validated every
``--eval-every`` steps (EMA weights, the held-out blocks of ``--val-corpus``).

The run is resumable across sessions: each invocation trains at most ``--session-minutes`` more CPU-minutes (one
thread, ``--budget-clock cpu``) and continues from the last checkpoint, until ``--total-minutes`` of training; the
record (a table and ``real_curve_<design>.png``) is rewritten from the validation history after each invocation
(``--session-minutes 0``: from a run stopped between sessions, without training).

    python bench/bench_real_curve.py --copied-layers 0 --total-minutes 120 --session-minutes 60 \\
        --corpus ../shared/data/text/*.train.txt --val-corpus VALID_DIR --work /work/runs/real_curve
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from _common import (
    BENCH,
    add_real_model_options,
    add_target_scaling_option,
    real_model,
    real_model_replace,
    report,
    rows_figure,
    run_target_scaling,
    table,
    target,
    target_scaling_argv,
)


def trained_seconds(out: Path) -> float:
    """CPU seconds the run has trained so far: its latest checkpoint's (a killed session keeps them), else 0."""
    latest = out / "checkpoints" / "latest"
    if not latest.is_file():
        return 0.0
    return float(json.loads((out / "checkpoints" / latest.read_text().strip() / "state.json").read_text())["elapsed_s"])


def curve(out: Path) -> list[dict]:
    """Validation points ``(step, tokens, cpu_s, ppl_ratio, kl, bridge_loss)`` from the run's history (the final
    report's, or the latest checkpoint's while the run goes on) and its log."""
    config = json.loads((out / "train_config.json").read_text())
    tokens_per_step = config["batch_size"] * config["grad_accum_steps"] * config["seq_len"]
    logged = {r["step"]: r["elapsed_s"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())}
    if (out / "result.json").is_file():  # a session's last step, which the log holds only on a multiple of its period
        final = json.loads((out / "result.json").read_text())
        logged[final["steps_trained"]] = final["train_seconds"]
    steps, seconds = zip(*sorted(logged.items()), strict=True)
    if (out / "validation.json").is_file():
        history = json.loads((out / "validation.json").read_text())["history"]
    else:
        latest = (out / "checkpoints" / "latest").read_text().strip()
        history = json.loads((out / "checkpoints" / latest / "stream.json").read_text())["validation_history"]
    return [
        {
            "step": point["step"],
            "tokens": point["step"] * tokens_per_step,
            "cpu_s": round(float(np.interp(point["step"], steps, seconds)), 1),  # between logged steps: linear
            "ppl_ratio": point["ppl_ratio"],
            "kl": point["kl"],
            "bridge_loss": point["bridge_loss"],
        }
        for point in sorted({p["step"]: p for p in history}.values(), key=lambda p: p["step"])
    ]


def train(model: Path, args: argparse.Namespace, out: Path) -> None:
    """One session of ``dihal replace`` (resumed when a checkpoint exists) up to the total CPU budget."""
    budget = min(args.total_minutes, trained_seconds(out) / 60 + args.session_minutes)
    real_model_replace(
        model, args, out,
        "--copied-layers", str(args.copied_layers), "--steps", str(args.steps), "--eval-every", str(args.eval_every),
        "--checkpoint-every", str(args.eval_every), "--log-every", str(args.eval_every), "--max-minutes", f"{budget:g}",
        *target_scaling_argv(args),
    )  # fmt: skip


def plot(points: list[dict], path: Path, title: str) -> None:
    """KL and PPL ratio against training tokens (log axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    tokens = [p["tokens"] for p in points]
    for axis, key, label in ((axes[0], "kl", "KL(backbone || hybrid), nats"), (axes[1], "ppl_ratio", "PPL ratio")):
        axis.plot(tokens, [p[key] for p in points], marker="o")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("training tokens")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_real_model_options(parser)
    parser.add_argument("--copied-layers", type=int, default=0, help="the bridge design (dihal replace's option)")
    parser.add_argument("--total-minutes", type=float, default=120.0, help="CPU minutes of training in all")
    parser.add_argument(
        "--session-minutes", type=float, default=60.0, help="CPU minutes this invocation adds (0: report only)"
    )
    parser.add_argument("--steps", type=int, default=2000, help="--steps (the cosine's length) of the run")
    parser.add_argument("--eval-every", type=int, default=25)
    add_target_scaling_option(parser)
    parser.add_argument("--question", default=None, help="the record's key (default: real_curve_copied_K)")
    args = parser.parse_args()
    out = args.work / f"copied_{args.copied_layers}"
    model = real_model(args)
    if args.session_minutes > 0:
        train(model, args, out)
    points = curve(out)
    question = args.question or f"real_curve_copied_{args.copied_layers}"
    title = f"Learning curve on {model.stem}, hidden state {args.layer}, {args.copied_layers} copied layers"
    if args.target_scaling:
        title += f", --target-scaling {args.target_scaling}"
    plot(points, BENCH / "results" / f"{question}.png", title)
    columns = list(points[0])
    values = [[p[c] for c in columns] for p in points]
    last = points[-1]
    shown = [row for row, p in zip(values, points, strict=True) if p["step"] % 50 == 0 or p is last]
    report(
        title,
        table(columns, shown) + f"\n\nEvery 50 steps and the last; the record's figures hold every validation point."
        f"\n\n![curve](results/{question}.png)",
        question=question,
        figures={
            "curve": rows_figure(columns, values),
            "copied_layers": args.copied_layers,
            "layer": args.layer,
            "target_scaling": run_target_scaling(out),
        },
        targets=[target("KL <= 0.4 nats", f"{last['kl']:.3f} at {last['tokens']} tokens", last["kl"] <= 0.4)],
    )


if __name__ == "__main__":
    main()
