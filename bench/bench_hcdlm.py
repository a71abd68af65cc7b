"""HC-DLM against MDM, Latent DM and AR at equal training time and parameter budget, on CPU.

Question: at the same training time, which model solves more held-out Sudoku (easy = singles-only, the
training grade; hard = needs strategies absent from training) and Countdown (CD3 / CD4 from the real
file) problems; how does accuracy change with the number of sampling steps (paper Fig. 3b); and what does
a sampling batch cost against MDM at equal steps?

Sudoku is 6x6 (2x3 boxes) by default: the smallest size with a hard split, and one that a ~0.75M-parameter model
can start to learn in minutes of CPU. Training time is process CPU time by default (``--clock cpu``): the
machine is shared and oversubscribed, so wall-clock budgets would hand models different amounts of compute.
Rerunning the same command resumes finished/unfinished runs instead of retraining.

    python bench/bench_hcdlm.py --tasks sudoku --minutes 5
    python bench/bench_hcdlm.py --tasks countdown --minutes 3

Its Countdown and text records are current (``hcdlm_countdown``, ``hcdlm_text``); Sudoku is compared under the
evaluation protocol by ``bench_hcdlm_protocol.py``, whose records replaced this script's Sudoku ones.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_tables, report, table  # noqa: E402

from dihal_fast.common import atomic_write_json  # noqa: E402
from dihal_fast.hcdlm.config import (  # noqa: E402
    HCDLMModelConfig,
    HCDLMTrainConfig,
    ObjectiveConfig,
    RunConfig,
    SampleConfig,
    task_defaults,
)
from dihal_fast.hcdlm.eval_data import examples_from_file, generated_sudoku, text_windows  # noqa: E402
from dihal_fast.hcdlm.models import generate  # noqa: E402
from dihal_fast.hcdlm.plots import plot_accuracy_vs_steps  # noqa: E402
from dihal_fast.hcdlm.scoring import accuracy_vs_steps, evaluate_examples, evaluate_text, load_run  # noqa: E402
from dihal_fast.hcdlm.trainer import train  # noqa: E402
from dihal_fast.tasks.registry import TaskConfig  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
LABELS = {
    "hcdlm": "HC-DLM",
    "hcdlm_absorbing": "HC-DLM (absorbing)",
    "hcdlm_paper": "HC-DLM (paper objective)",
    "hcdlm_absorbing_paper": "HC-DLM (absorbing, paper objective)",
    "mdm": "MDM",
    "latent": "Latent DM",
    "ar": "AR",
    "ccdd": "CCDD",
}
# bench name -> (model kind, scaffold kernel, objective overrides); "paper objective" = without our exposure share,
# with the paper's scaffold drop for guidance
PAPER_OBJECTIVE = {"exposure_share": 0.0, "guidance_training": True}
VARIANTS = {
    "hcdlm_absorbing": ("hcdlm", "absorbing", {}),
    "hcdlm_paper": ("hcdlm", "uniform", PAPER_OBJECTIVE),
    "hcdlm_absorbing_paper": ("hcdlm", "absorbing", PAPER_OBJECTIVE),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--tasks", default="sudoku,countdown", help="comma-separated: sudoku, countdown, text")
    p.add_argument(
        "--models",
        default="hcdlm,hcdlm_absorbing,mdm,latent,ar",
        help="comma-separated models (hcdlm = uniform scaffold kernel, hcdlm_absorbing = [MASK] kernel)",
    )
    p.add_argument("--minutes", type=float, default=5.0, help="training time per model")
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu", help="what --minutes measures")
    p.add_argument("--hidden", type=int, default=64, help="width of every network (baselines get matched depth)")
    p.add_argument("--batch-size", type=int, default=64, help="training batch")
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help="AdamW learning rate (default: the task's, as in 'dihal hcdlm train'; the paper: 1e-4 at batch 256)",
    )
    p.add_argument(
        "--latent-dim",
        type=int,
        default=None,
        help="latent width d of HC-DLM and Latent DM (default: the task's, as in 'dihal hcdlm train'); the baselines "
        "keep matching the parameter count of the default-width HC-DLM",
    )
    p.add_argument(
        "--blocks",
        default=None,
        help="HC-DLM encoder,denoiser,predictor blocks (the solving is the denoiser's; default 1,D,1 with D the "
        "task's denoiser default, as in 'dihal hcdlm train': 12 for 9x9 Sudoku, 6 otherwise)",
    )
    p.add_argument(
        "--baseline-blocks",
        type=int,
        default=0,
        help="blocks of MDM / AR / CCDD (0: as many as match the HC-DLM parameter count)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override of the HC-DLM / Latent DM run configs (not the baselines'), e.g. "
        "model.latent_schedule_power=2.0 (JSON values)",
    )
    p.add_argument("--sudoku-box", default="2x3", help="Sudoku box shape")
    p.add_argument("--sudoku-pool", type=int, default=3000, help="generated training puzzles (singles grade)")
    p.add_argument("--eval-n", type=int, default=300, help="test problems per group (fresh puzzles / real file)")
    p.add_argument(
        "--eval-seed",
        type=int,
        default=123,
        help="generator seed of the fresh Sudoku test puzzles (validation: always seed 7)",
    )
    p.add_argument(
        "--val-n", type=int, default=150, help="validation problems per group, used only to pick sampler settings"
    )
    p.add_argument("--seeds", default="0", help="comma-separated training seeds per model (tables show mean +- std)")
    p.add_argument("--steps-list", default="5,10,25,50", help="sampling steps for the accuracy-vs-steps curve")
    p.add_argument(
        "--sample-steps",
        default="50",
        help="sampling-step candidates, chosen on validation with the other sampler settings (the paper: 50)",
    )
    p.add_argument(
        "--cfg-weight",
        type=float,
        default=2.75,
        help="guidance weight among HC-DLM's validation candidates (0 = never)",
    )
    p.add_argument(
        "--best-of",
        default="1",
        help="best-of-K candidates (--best-of of 'dihal hcdlm eval'), chosen on validation with the other sampler "
        "settings; MDM and AR try K > 1 at --best-of-temperature (at temperature 0 their K chains are one)",
    )
    p.add_argument(
        "--best-of-temperature",
        type=float,
        default=1.0,
        help="MDM / AR: the token temperature of their best-of-K candidates (K > 1)",
    )
    p.add_argument(
        "--try-clamp",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="HC-DLM: try --clamp among the validation candidates (--no-try-clamp halves the validation sampling)",
    )
    p.add_argument("--text-len", type=int, default=64, help="text: tokens per sample")
    p.add_argument("--text-latents", type=int, default=4, help="text: HC-DLM latent vectors M")
    p.add_argument("--text-samples", type=int, default=64, help="text: samples scored for Gen PPL")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument(
        "--device", default="cpu", help="cpu, cuda or cuda:N (on a GPU use --clock wall: CPU time misses GPU work)"
    )
    p.add_argument("--out", type=Path, default=Path("runs/bench_hcdlm"), help="run directories and results.json")
    p.add_argument("--no-append", action="store_true", help="print only; do not write the record under bench/results/")
    p.add_argument(
        "--question", default=None, help="bench/results/ record to write (default: hcdlm_<task>, by board size)"
    )
    p.add_argument(
        "--train-only",
        action="store_true",
        help=(
            "train (or resume) the runs and stop: start one process per model to share the cores, then rerun without "
            "it to evaluate"
        ),
    )
    return p.parse_args()


def override(config: RunConfig, items: list[str]) -> RunConfig:
    """``config`` with each ``SECTION.FIELD=VALUE`` of ``items`` set (VALUE read as JSON)."""
    for item in items:
        key, value = item.split("=", 1)
        section, name = key.split(".")
        setattr(config, section, replace(getattr(config, section), **{name: json.loads(value)}))
    return config


def run_config(task: str, model: str, args: argparse.Namespace, seed: int = 0) -> RunConfig:
    latents = 1
    if task == "sudoku":
        task_cfg = TaskConfig("sudoku", sudoku_box=args.sudoku_box, sudoku_pool=args.sudoku_pool)
    elif task == "countdown":
        task_cfg = TaskConfig("countdown", countdown_numbers=[3, 4])
    else:
        from dihal_fast.backbone import default_model_dir

        task_cfg = TaskConfig(
            "text",
            text_files=[str(SHARED / "text" / "tinystories.train.txt")],
            text_len=args.text_len,
            text_max_chars=400_000,
            tokenizer_dir=str(default_model_dir()),
        )
        latents = args.text_latents
    defaults = task_defaults(task_cfg.name, task_cfg.sudoku_box)  # the command line's, for every model
    kind, kernel, objective = VARIANTS.get(model, (model, "uniform", {}))
    encoder, denoiser, predictor = hcdlm_blocks(task, args)
    if kind in ("mdm", "ar", "ccdd"):  # HC-DLM-only options off, so a baseline's saved config claims no slot head
        objective = {**objective, "slot_aux_weight": 0.0}
    model_cfg = HCDLMModelConfig(
        kind=kind,
        kernel=kernel,
        hidden=args.hidden,
        heads=4,
        latents=latents,
        encoder_blocks=encoder,
        slot_head=kind not in ("mdm", "ar", "ccdd"),
        denoiser_blocks=denoiser,
        predictor_blocks=predictor,
        latent_dim=(
            args.latent_dim
            if args.latent_dim is not None and kind in ("hcdlm", "latent")
            else int(defaults["latent_dim"])
        ),
        latent_schedule_power=defaults["latent_schedule_power"],
        baseline_blocks=args.baseline_blocks,
    )
    config = RunConfig(
        task=task_cfg,
        model=model_cfg,
        objective=ObjectiveConfig(**objective),
        train=HCDLMTrainConfig(
            steps=10**7,
            batch_size=args.batch_size,
            lr=defaults["lr"] if args.lr is None else args.lr,
            max_minutes=args.minutes,
            seed=seed,
            budget_clock=args.clock,
            threads=args.threads,
            checkpoint_every=200,
            log_every=50,
            device=args.device,
        ),
    )
    return override(config, getattr(args, "set", [])) if kind in ("hcdlm", "latent") else config


def hcdlm_blocks(task: str, args: argparse.Namespace) -> tuple[int, int, int]:
    """HC-DLM (encoder, denoiser, predictor) blocks: --blocks, else 1, the task's denoiser default, 1."""
    if args.blocks:
        encoder, denoiser, predictor = (int(b) for b in args.blocks.split(","))
        return encoder, denoiser, predictor
    return 1, int(task_defaults(task, args.sudoku_box)["denoiser_blocks"]), 1


def eval_examples(task: str, run, args: argparse.Namespace, split: str = "test") -> list:
    """Test or validation problems: disjoint generator seeds for fresh Sudoku, disjoint slices of the real files."""
    count = args.eval_n if split == "test" else args.val_n
    if task == "sudoku":
        seed = args.eval_seed if split == "test" else 7
        examples = generated_sudoku(run.task, "easy", count, seed=seed) + generated_sudoku(
            run.task, "hard", count, seed=seed
        )
        kaggle = SHARED / "sudoku_kaggle3m_curated5000.csv"
        if run.task.geo.n == 9 and kaggle.is_file():  # the real puzzles, one group per rated level
            by_level: dict[str, list] = {}
            for ex in examples_from_file(run.task, kaggle):
                by_level.setdefault(ex.group, []).append(ex)
            window = slice(0, count) if split == "test" else slice(args.eval_n, args.eval_n + count)
            examples += [ex for group in by_level.values() for ex in group[window]]
        return examples
    examples = examples_from_file(run.task, SHARED / "countdown.jsonl")
    window = slice(0, count) if split == "test" else slice(args.eval_n, args.eval_n + count)
    return [e for g in ("cd3", "cd4") for e in [x for x in examples if x.group == g][window]]


def run_name(model: str, seed: int) -> str:
    """Run directory name of a model and training seed (seed 0 keeps the plain name of earlier results)."""
    return model if seed == 0 else f"{model}-seed{seed}"


def sampler_candidates(model: str, args: argparse.Namespace, guidance: bool = True) -> list[dict]:
    """Sampler settings tried on the validation split (never on the test problems); AR has no steps to choose,
    guidance is tried only on a run trained for it (``guidance``), and every setting with each ``--best-of`` K."""
    if model == "ar":
        options = [{}]
    elif model in ("mdm", "ccdd"):  # CCDD's token chain unmasks as MDM's does
        options = [{"order": "margin"}, {"order": "prob"}]
    else:
        weights = [0.0] + ([args.cfg_weight] if args.cfg_weight and model != "latent" and guidance else [])
        clamps = (False, True) if args.try_clamp else (False,)
        options = [{"cfg_weight": w, "clamp": c} for w in weights for c in clamps]
    sampled = model in ("mdm", "ar")  # deterministic at temperature 0: their K > 1 needs a temperature
    options = [
        option if k == 1 else {**option, "best_of": k, **({"temperature": args.best_of_temperature} if sampled else {})}
        for option in options
        for k in int_list(args.best_of)
    ]
    if model == "ar":
        return options
    return [{**option, "steps": steps} for steps in int_list(args.sample_steps) for option in options]


def int_list(text: str) -> list[int]:
    """``"5,10,25"`` -> ``[5, 10, 25]``."""
    return [int(s) for s in text.split(",") if s]


def pick_sampler(run, model: str, val: list, base: SampleConfig, args: argparse.Namespace) -> tuple[dict, list[dict]]:
    """The candidate with the best validation accuracy (ties: the first), and every candidate's score."""
    candidates = sampler_candidates(model, args, run.config.objective.guidance_training)
    tried = []
    for option in candidates:
        result = evaluate_examples(run, val, replace(base, **option), show=0)
        tried.append({**option, "val_accuracy": result["accuracy"]})
    best = max(range(len(tried)), key=lambda i: (tried[i]["val_accuracy"], -i))
    return candidates[best], tried


def sampling_seconds(runs: dict, examples: list, steps_list: list[int], batch: int = 64, rounds: int = 3) -> dict:
    """Median seconds of one sampling batch per model and step count, rounds interleaved across models.

    Process CPU time on CPU (wall-clock on a shared, oversubscribed machine depends on what else runs
    at that moment); wall-clock with synchronisation on CUDA.
    """
    device = next(iter(runs.values())).device
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    contexts = torch.tensor([e.context for e in examples[:batch]], device=device)

    def timed(run, steps: int) -> float:
        began = clock()
        generate(run.model, run.kernel, contexts, SampleConfig(steps=steps))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return clock() - began

    times: dict = {name: {s: [] for s in steps_list} for name in runs}
    for run in runs.values():
        timed(run, 2)  # warm-up
    for _ in range(rounds):
        for steps in steps_list:
            for name, run in runs.items():
                times[name][steps].append(timed(run, steps))
    return {name: {s: sorted(v)[len(v) // 2] for s, v in per.items()} for name, per in times.items()}


def bench_text(models: list[str], args: argparse.Namespace) -> dict:
    """Gen PPL (shipped backbone as evaluator) and entropy of samples from each model, and of real text."""
    from dihal_fast.backbone import default_model_dir

    steps = max(int_list(args.steps_list))
    results, reference = {}, None
    for model in models:
        run_dir = args.out / "text" / model
        summary = train(run_config("text", model, args), run_dir)
        run = load_run(run_dir, device=args.device)
        if reference is None:
            reference = text_windows(run.task, SHARED / "text" / "tinystories.valid.txt", args.text_samples)
        report_ = evaluate_text(
            run,
            args.text_samples,
            SampleConfig(steps=steps, temperature=1.0, batch_size=64),
            default_model_dir(),
            reference,
        )
        results[model] = {
            "train": summary,
            **{k: v for k, v in report_.items() if k != "examples"},
            "examples": report_["examples"][:2],
        }
    atomic_write_json(args.out / "text_results.json", results)
    return {"results": results, "steps": steps}


def render_text(out: dict, args: argparse.Namespace) -> str:
    rows = [
        [
            LABELS[m],
            r["train"]["parameters"],
            r["train"]["step"],
            round(r["train"]["elapsed_s"]),
            round(r["gen_ppl"], 1),
            round(r["entropy"], 3),
        ]
        for m, r in out["results"].items()
    ]
    data = next(iter(out["results"].values()))["data_reference"]
    rows.append(["data (tinystories.valid windows)", "", "", "", round(data["gen_ppl"], 1), round(data["entropy"], 3)])
    return (
        table(["model", "params", "train steps", f"train {args.clock} s", "Gen PPL", "entropy"], rows)
        + f"\n\n{args.text_samples} samples of {args.text_len} tokens, {out['steps']} steps (AR: left to right), "
        "float64 sampling at "
        "temperature 1; Gen PPL under the shipped backbone (float32, token-pooled, its BOS prepended), entropy = mean "
        "per-sample unigram entropy (nats) of the evaluator's tokens. Trained on the first 400k characters of "
        "tinystories.train."
    )


def pooled(row: dict, key: str) -> float:
    """The example-weighted mean of ``key`` over a curve row's groups."""
    groups = row["groups"].values()
    return sum(g[key] * g["n"] for g in groups) / sum(g["n"] for g in groups)


def bench_task(task: str, models: list[str], args: argparse.Namespace) -> dict:
    """Train every model x seed, pick its sampler (steps included) on validation, score the test split with it."""
    steps_list = sorted(set(int_list(args.steps_list)) | set(int_list(args.sample_steps)))
    seeds = int_list(args.seeds)
    base = SampleConfig(steps=max(steps_list), batch_size=200)
    results, examples = {}, []
    for model in models:
        runs = []
        for seed in seeds:
            run_dir = args.out / task / run_name(model, seed)
            summary = train(run_config(task, model, args, seed), run_dir)
            run = load_run(run_dir, device=args.device)
            examples, val = eval_examples(task, run, args), eval_examples(task, run, args, "validation")
            chosen, tried = pick_sampler(run, model, val, base, args)
            curve = accuracy_vs_steps(run, examples, steps_list, replace(base, **chosen))
            main_row = next(row for row in curve if row["steps"] == chosen.get("steps", max(steps_list)))
            runs.append(
                {
                    "seed": seed,
                    "train": summary,
                    "sampler": tried,
                    "chosen": chosen,
                    "curve": curve,
                    "groups": main_row["groups"],
                    "accuracy": main_row["accuracy"],
                }
            )
            logging.info(
                "%s/%s seed %d: %s",
                task,
                model,
                seed,
                {g: round(v["accuracy"], 4) for g, v in runs[-1]["groups"].items()},
            )
        results[model] = {
            "runs": runs,
            "train": runs[0]["train"],
            "curve": runs[0]["curve"],
            "groups": runs[0]["groups"],
        }
    timing = {}
    if "hcdlm" in results and "mdm" in results:
        timing = sampling_seconds(
            {m: load_run(args.out / task / run_name(m, seeds[0]), device=args.device) for m in ("hcdlm", "mdm")},
            examples,
            steps_list,
        )
    plot = plot_accuracy_vs_steps(
        {LABELS[m]: r["curve"] for m, r in results.items()},
        args.out / f"{task}_accuracy_vs_steps.png",
        f"{task}: accuracy vs sampling steps (seed {seeds[0]})",
    )
    key = "blank_cells" if task == "sudoku" else "true_steps"
    plot_accuracy_vs_steps(
        {
            LABELS[m]: [{"steps": c["steps"], "accuracy": pooled(c, key)} for c in r["curve"]]
            for m, r in results.items()
        },
        args.out / f"{task}_{key}_vs_steps.png",
        f"{task}: {key.replace('_', ' ')} vs sampling steps",
        f"{key.replace('_', ' ')} (%)",
    )
    atomic_write_json(args.out / f"{task}_results.json", {"models": results, "sampling_seconds": timing})
    return {"results": results, "plot": str(plot), "steps_list": steps_list, "timing": timing}


def mean_std(values: list[float]) -> str:
    """``"m"`` for one value, ``"m +- sd"`` (population sd) for several; percentages."""
    values = [100 * v for v in values]
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.1f}"
    return f"{mean:.1f} ± {(sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5:.1f}"


def render(task: str, out: dict, args: argparse.Namespace) -> str:
    results, steps_list = out["results"], out["steps_list"]
    groups = list(next(iter(results.values()))["groups"])  # easy/hard (+ Kaggle levels for 9x9) or cd3/cd4
    extras = (
        [("blank_cells", "blank cells")] if task == "sudoku" else [("loose", "loose"), ("true_steps", "true steps")]
    )
    header = ["model", "seeds", "params", "train steps", f"train {args.clock} s", "sampler (chosen on validation)"]
    header += [f"{g} acc %" for g in groups] + [f"{g} {label} %" for key, label in extras for g in groups]
    rows = []
    for model, r in results.items():
        runs = r["runs"]
        chosen = "; ".join(
            sorted({", ".join(f"{k}={v}" for k, v in run["chosen"].items()) or "left to right" for run in runs})
        )
        cells = [mean_std([run["groups"][g]["accuracy"] for run in runs]) for g in groups]
        cells += [mean_std([run["groups"][g][key] for run in runs]) for key, _ in extras for g in groups]
        rows.append(
            [
                LABELS[model],
                len(runs),
                r["train"]["parameters"],
                round(sum(run["train"]["step"] for run in runs) / len(runs)),
                round(r["train"]["elapsed_s"]),
                chosen,
            ]
            + cells
        )
    text = table(header, rows)
    partial_key, partial_label = extras[-1]
    curve_rows = [
        [LABELS[m]] + [f"{100 * c['accuracy']:.1f} / {100 * pooled(c, partial_key):.1f}" for c in r["curve"]]
        for m, r in results.items()
    ]
    text += (
        f"\n\nAccuracy / {partial_label} (%, all groups, seed {int_list(args.seeds)[0]}, chosen sampler) vs "
        "sampling steps (AR decodes left to right; its row repeats):\n\n"
    )
    text += table(["model"] + [str(s) for s in steps_list], curve_rows)
    if out["timing"]:
        t_h, t_m = out["timing"]["hcdlm"], out["timing"]["mdm"]
        kind = (
            "wall-clock seconds on " + args.device
            if args.device.startswith("cuda")
            else "process CPU seconds on one thread"
        )
        text += (
            f"\n\nSampling time per batch of 64, {kind} (median of 3 interleaved rounds, no guidance or clamping):\n\n"
        )
        text += table(
            ["steps", "HC-DLM s", "MDM s", "HC-DLM / MDM"],
            [[s, round(t_h[s], 3), round(t_m[s], 3), round(t_h[s] / t_m[s], 2)] for s in steps_list],
        )
        text += (
            "\n\nMDM skips steps that reveal no token, so beyond L steps (L = target tokens) its cost stops growing."
        )
    text += (
        f"\n\nTest: {args.eval_n} problems per group; sampler settings picked per run on {args.val_n} separate "
        "validation problems "
        f"per group, sampling steps among {args.sample_steps}"
        + (f", best-of-K among {args.best_of}" if args.best_of != "1" else "")
        + ". Main accuracies at the chosen steps, argmax tokens"
        + (
            f" (MDM and AR at temperature {args.best_of_temperature} where best-of-K > 1 was chosen)"
            if args.best_of != "1"
            else ""
        )
        + ", EMA weights, HC-DLM M=1 (blocks "
        f"encoder,denoiser,predictor = {','.join(map(str, hcdlm_blocks(task, args)))}; confidence re-masking for "
        "the absorbing kernel); plot: "
        f"`{out['plot']}`."
    )
    return text


def question_key(task: str, args: argparse.Namespace) -> str:
    """The bench/results/ record of ``task``: hcdlm_sudoku (6x6), hcdlm_sudoku9 (9x9), hcdlm_countdown, hcdlm_text."""
    if task != "sudoku" or args.sudoku_box == "2x3":
        return f"hcdlm_{task}"
    rows, cols = (int(side) for side in args.sudoku_box.split("x"))
    return f"hcdlm_sudoku{rows * cols}"


def main() -> int:
    args = parse_args()
    if args.device.startswith("cuda") and args.clock == "cpu":
        raise SystemExit("--device cuda needs --clock wall: process CPU time does not count GPU work")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    torch.set_num_threads(args.threads)
    models = [m for m in args.models.split(",") if m]
    if args.train_only:
        for task in [t for t in args.tasks.split(",") if t]:
            for model in models:
                for seed in int_list(args.seeds):
                    train(run_config(task, model, args, seed), args.out / task / run_name(model, seed))
        return 0
    for task in [t for t in args.tasks.split(",") if t]:
        if task == "text":
            out = bench_text(models, args)
            body = render_text(out, args)
            extra = {}
        else:
            out = bench_task(task, models, args)
            body = render(task, out, args)
            # Every sampler candidate's validation accuracy, per model and seed: what chose the test settings.
            extra = {
                "validation": {m: {r["seed"]: r["sampler"] for r in res["runs"]} for m, res in out["results"].items()}
            }
        title = (
            f"HC-DLM vs MDM / Latent DM / AR: {task} ({args.minutes:g} {args.clock}-minutes of training per model, "
            f"hidden {args.hidden})"
        )
        if args.no_append:
            print(body)
        else:
            report(
                title,
                body,
                question=args.question or question_key(task, args),
                figures={
                    "tables": markdown_tables(body),
                    "minutes": args.minutes,
                    "models": models,
                    **extra,
                },
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
