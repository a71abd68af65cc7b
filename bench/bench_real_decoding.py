"""Do the real-model hybrid's samples read like its backbone's at the decoding settings users sample with, and how
does the gap follow the hybrid's KL? SmolLM2-135M-Instruct at hidden state 3.

``dihal replace`` runs on the English training texts (one thread, CPU-second budgets), ``--designs`` of
:data:`DESIGNS`: the default design at ``--minutes`` (what ``dihal replace --max-minutes 30`` gives a user) and at
``--short-minutes``, the all-copied design (``--copied-layers 3``: the backbone's layers 1..3 and a learned
correction, the low-KL end) at ``--short-minutes``, and the default with on-policy distillation at ``--minutes``
(every second distillation step on the hybrid's own continuations of a 32-token prompt; forward or reverse KL).
Each hybrid is scored by ``dihal evaluate`` on the held-out English blocks at every decoding setting of
``--decoding`` (temperature / top-p; unconditional samples from the start-of-document token, the same seed for
hybrid and backbone): KL and PPL teacher-forced, Gen PPL under the backbone with its bootstrap interval, unigram
entropy, diversity, and each sample's own distinct-4 (repetition inside a sample; the hybrid's mean minus the
backbone's with a bootstrap interval). ``--extra-run LABEL=DIR`` scores and fits a finished run of the default design
trained elsewhere (the learning curve's longest). Per setting, log(Gen PPL ratio) is fitted as a line through the
origin in KL over the teacher-forced designs, which gives the KL such a hybrid needs for a stated Gen PPL ratio; the
``real_curve_copied_2`` record's law (KL against training tokens past 75k tokens; ``real_curve_copied_2_SCALING``
with ``--target-scaling SCALING``) turns that KL into tokens.
Finished runs and evaluations are reused, so two processes can train disjoint ``--designs`` into one ``--work``
and a last invocation with all of them writes the record.

    python bench/bench_real_decoding.py --corpus ../shared/data/text/*.train.txt --val-corpus VALID_DIR \\
        --work /work/runs/real_decoding [--minutes 30 --short-minutes 5] [--designs default,copied,...]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from _common import (
    RESULTS_DIR,
    add_real_model_options,
    add_target_scaling_option,
    dihal_one_thread,
    read_record,
    real_model,
    real_model_replace,
    report,
    rows_figure,
    run_target_scaling,
    table,
    target,
    target_scaling_argv,
)

from dihal_fast.common.hf_loading import load_tokenizer
from dihal_fast.common.metrics import distinct_n
from dihal_fast.evaluate.scoring import INTERVAL_DRAWS

ON_POLICY = ("--on-policy-every", "2", "--on-policy-prefix", "32")
# name: (row label with {long}/{short} minutes, replace options, long or short budget, in the KL fit)
DESIGNS = {
    "default": ("default, {long} min", (), "long", True),
    "short": ("default, {short} min", (), "short", True),
    "copied": ("all copied, {short} min", ("--copied-layers", "3"), "short", True),
    "on_policy": ("on-policy, {long} min", ON_POLICY, "long", False),
    "on_policy_reverse": (
        "on-policy reverse KL, {long} min",
        (*ON_POLICY, "--kd-divergence", "reverse"),
        "long",
        False,
    ),
}
RATIO_GOAL = 1.2  # Gen PPL within 20 % of the backbone's: "reads like the backbone's"
EXCERPT_CHARS = 160
REPEAT_N = 4  # the n of the per-sample distinct-n that measures repetition inside a sample


def per_sample_distinct(texts: list[str], tokenizer) -> np.ndarray:
    """Distinct-``REPEAT_N`` of each sample on its own (unique / total n-grams of the retokenised text): 1 for a
    sample that never repeats a 4-gram, low for one caught in a loop. The pooled diversity has no per-sample unit, so
    this is the measure an interval can be put on."""
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    return np.array([distinct_n([sample], REPEAT_N) for sample in ids if len(sample) >= REPEAT_N])


def difference_interval(hybrid: np.ndarray, backbone: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``hybrid`` minus mean of ``backbone`` and its 95 % bootstrap interval (the two sample sets drawn
    independently: unconditional samples are not paired)."""
    rng = np.random.default_rng(seed)
    draws = [
        rng.choice(hybrid, hybrid.size).mean() - rng.choice(backbone, backbone.size).mean()
        for _ in range(INTERVAL_DRAWS)
    ]
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(hybrid.mean() - backbone.mean()), float(low), float(high)


def decoding_setting(text: str) -> tuple[float, float]:
    """``"0.7/0.9"`` -> (temperature 0.7, top-p 0.9)."""
    temperature, top_p = (float(v) for v in text.split("/"))
    return temperature, top_p


def evaluate(run: Path, stem: str, setting: tuple[float, float], args: argparse.Namespace) -> dict:
    """``dihal evaluate`` of the replace run at one decoding setting into ``--work`` (reused when finished)."""
    temperature, top_p = setting
    out = args.work / f"{stem}_eval_t{temperature:g}_p{top_p:g}"
    if not (out / "evaluate.json").is_file():
        dihal_one_thread(
            "evaluate", "--hybrid", str(run), "--corpus", str(args.val_corpus), "--n-samples", str(args.samples),
            "--max-new-tokens", str(args.sample_tokens), "--temperature", f"{temperature:g}", "--top-p",
            f"{top_p:g}", "--out", str(out),
        )  # fmt: skip
    return json.loads((out / "evaluate.json").read_text())


def run_stem(label: str) -> str:
    """A row label as the folder name of its run and evaluations: ``"default, 30 min"`` -> ``default_30_min``."""
    return label.replace(", ", "_").replace(" ", "_")


def extra_run(text: str) -> tuple[str, Path]:
    """``"LABEL=DIR"`` -> (LABEL, DIR), checked before any work: DIR must hold a finished replace run."""
    label, sep, directory = text.partition("=")
    run = Path(directory)
    if not sep or not label or not (run / "result.json").is_file():
        raise SystemExit(f"--extra-run {text!r}: expected LABEL=DIR with DIR a finished replace run (its result.json)")
    return label, run


def tokens_for_kl(kl: float, curve: str) -> float | None:
    """Training tokens the default design needs for ``kl`` by the power law of the learning-curve record ``curve``
    (its points past 75k tokens), or None without the record."""
    path = RESULTS_DIR / f"{curve}.json"
    if not path.is_file():
        return None
    curve = read_record(path)["figures"]["curve"]
    columns = curve["columns"]
    points = [(row[columns.index("tokens")], row[columns.index("kl")]) for row in curve["rows"]]
    tokens, kls = np.array([p for p in points if p[0] > 75_000]).T
    slope, intercept = np.polyfit(np.log(tokens), np.log(kls), 1)
    return float(math.exp((math.log(kl) - intercept) / slope))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_real_model_options(parser)
    parser.add_argument("--minutes", type=float, default=30.0, help="CPU minutes of the default run")
    parser.add_argument("--short-minutes", type=float, default=5.0, help="CPU minutes of the two short runs")
    parser.add_argument("--decoding", default="1/1,0.7/0.9", help="temperature/top-p settings, comma-separated")
    parser.add_argument("--samples", type=int, default=64, help="samples per model and setting")
    parser.add_argument("--sample-tokens", type=int, default=128)
    parser.add_argument(
        "--designs", default="default,copied,on_policy_reverse", help=f"comma-separated, of {', '.join(DESIGNS)}"
    )
    parser.add_argument(
        "--extra-run",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="a finished run of the default design trained elsewhere (e.g. the learning curve's), scored and fitted "
        "beside the designs; repeatable",
    )
    add_target_scaling_option(parser)
    parser.add_argument("--question", default="real_decoding_smollm2")
    args = parser.parse_args()
    settings = [decoding_setting(text) for text in args.decoding.split(",")]
    extra_runs = [extra_run(text) for text in args.extra_run]
    model = real_model(args)
    scaling_suffix = f"_{args.target_scaling}" if args.target_scaling else ""  # a run of its own, never reused
    runs, validation_kl, scalings, fitted = {}, {}, {}, set()
    for key in args.designs.split(","):
        label, options, budget, in_fit = DESIGNS[key]
        minutes = args.minutes if budget == "long" else args.short_minutes
        name = label.format(long=f"{args.minutes:g}", short=f"{args.short_minutes:g}")
        out = args.work / (run_stem(name) + scaling_suffix)
        if not (out / "result.json").is_file():
            real_model_replace(
                model,
                args,
                out,
                *options,
                *target_scaling_argv(args),
                "--max-minutes",
                f"{minutes:g}",
                "--checkpoint-every",
                "25",
            )
        runs[name] = {setting: evaluate(out, out.name, setting, args) for setting in settings}
        validation_kl[name] = json.loads((out / "result.json").read_text())["validation"]["kl"]
        scalings[name] = run_target_scaling(out)
        if in_fit:
            fitted.add(name)
    for name, out in extra_runs:
        runs[name] = {setting: evaluate(out, run_stem(name), setting, args) for setting in settings}
        validation_kl[name] = json.loads((out / "result.json").read_text())["validation"]["kl"]
        scalings[name] = run_target_scaling(out)
        fitted.add(name)
    columns = [
        "hybrid", "T / top-p", "KL (validation)", "KL (evaluation)", "PPL ratio", "Gen PPL [95 %]",
        "backbone Gen PPL [95 %]", "Gen PPL ratio",
        "diversity (backbone)", "entropy (backbone)",
        f"distinct-{REPEAT_N} per sample (backbone)", "hybrid - backbone [95 %]",
    ]  # fmt: skip
    rows, fits = [], {}
    tokenizer = load_tokenizer(model)
    for setting in settings:
        points = []
        for name, by_setting in runs.items():
            hybrid, backbone = by_setting[setting]["hybrid"], by_setting[setting]["backbone"]
            samples = by_setting[setting]["samples"]
            own, base = (per_sample_distinct(samples[kind], tokenizer) for kind in ("hybrid", "backbone"))
            gap, gap_low, gap_high = difference_interval(own, base)
            ratio = hybrid["gen_ppl"] / backbone["gen_ppl"]
            if name in fitted:  # on the learning curve's scale: the validation blocks' KL
                points.append((validation_kl[name], math.log(ratio)))
            low, high = hybrid["gen_ppl_interval"]
            base_low, base_high = backbone["gen_ppl_interval"]
            rows.append([
                name, f"{setting[0]:g} / {setting[1]:g}", round(validation_kl[name], 3), round(hybrid["kl"], 3),
                round(hybrid["ppl"] / backbone["ppl"], 3),
                f"{hybrid['gen_ppl']:.1f} [{low:.1f}, {high:.1f}]",
                f"{backbone['gen_ppl']:.1f} [{base_low:.1f}, {base_high:.1f}]", round(ratio, 2),
                f"{hybrid['diversity_dihal']:.3f} ({backbone['diversity_dihal']:.3f})",
                f"{hybrid['entropy']:.2f} ({backbone['entropy']:.2f})",
                f"{own.mean():.3f} ({base.mean():.3f})", f"{gap:+.3f} [{gap_low:+.3f}, {gap_high:+.3f}]",
            ])  # fmt: skip
        kl, log_ratio = np.array(points).T
        per_nat = float(kl @ log_ratio / (kl @ kl))  # log(Gen PPL ratio) = per_nat x KL
        needed = math.log(RATIO_GOAL) / per_nat if per_nat > 0 else None
        fits[f"{setting[0]:g}/{setting[1]:g}"] = {
            "log_ratio_per_nat": round(per_nat, 3),
            "kl_for_goal": None if needed is None else round(needed, 4),
            "tokens_for_goal": None
            if needed is None
            else tokens_for_kl(needed, f"real_curve_copied_2{scaling_suffix}"),
        }
    fit_rows = [
        [
            key,
            fit["log_ratio_per_nat"],
            fit["kl_for_goal"],
            "n/a" if fit["tokens_for_goal"] is None else f"{fit['tokens_for_goal']:.3g}",
        ]
        for key, fit in fits.items()
    ]
    default = next(iter(runs))
    excerpts = []
    for setting in settings:
        evaluation = runs[default][setting]
        excerpts.append(f"**T {setting[0]:g}, top-p {setting[1]:g}**")
        for kind in ("backbone", "hybrid"):
            for text in evaluation["samples"][kind][:2]:
                excerpts.append(f"- {kind}: {' '.join(text.split())[:EXCERPT_CHARS]!r}")
    default_rows = [row for row in rows if row[0] == default]
    body = (
        table(columns, rows)
        + "\n\nKL (validation): on the run's 32 validation blocks (the learning curve's); KL (evaluation): on the "
        "last 32 blocks `dihal evaluate` holds out; PPL ratio on the latter."
        + f"\n\nlog(Gen PPL ratio) = a x KL (validation) through the origin over {', '.join(sorted(fitted))}, per "
        f"setting; the KL for a Gen PPL ratio of "
        f"{RATIO_GOAL} and the training tokens the default needs for it by the learning curve's power law:\n\n"
        + table(["T / top-p", "a (per nat)", f"KL for ratio {RATIO_GOAL}", "tokens (curve law)"], fit_rows)
        + f"\n\nThe first two samples of each model ({default}), first {EXCERPT_CHARS} characters:\n\n"
        + "\n".join(excerpts)
    )
    report(
        f"The SmolLM2-135M hybrid's samples against its backbone's at {len(settings)} decoding settings"
        + (f", --target-scaling {args.target_scaling}" if args.target_scaling else ""),
        body,
        question=args.question,
        figures={
            "runs": rows_figure(columns, rows),
            "fits": fits,
            "samples": args.samples,
            "target_scaling": scalings,
        },
        targets=[
            target(
                f"{default}: Gen PPL within {RATIO_GOAL}x the backbone's at T {row[1]}",
                row[7],
                row[7] <= RATIO_GOAL,
            )
            for row in default_rows
        ],
    )


if __name__ == "__main__":
    main()
