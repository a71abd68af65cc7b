"""``dihal hcdlm train|eval|solve``: HC-DLM and its baselines on Sudoku, Countdown and text."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from dihal_fast.common.options import HelpFormatter, add_dataclass_options, comma_integers, dataclass_from_options

logger = logging.getLogger(__name__)


def _add_train(sub: argparse._SubParsersAction) -> None:
    from dihal_fast.hcdlm.config import RunConfig
    from dihal_fast.train.settings import DEEPSPEED_HELP

    p = sub.add_parser("train", formatter_class=HelpFormatter, help="train (or resume) a model on a task",
                       description="Train HC-DLM or a baseline; rerunning with the same --out resumes from the newest "
                                   "checkpoint. Several processes with DeepSpeed ZeRO: torchrun --nproc_per_node N "
                                   "$(which dihal) hcdlm train --deepspeed CFG ...")
    p.add_argument("--out", type=Path, required=True, help="run directory (checkpoints/, config.json, log.jsonl)")
    p.add_argument("--deepspeed", default=None, metavar="CFG", help=DEEPSPEED_HELP)
    add_dataclass_options(p, RunConfig)
    p.set_defaults(func=run_train)


def _add_sampling(p: argparse.ArgumentParser) -> None:
    from dihal_fast.hcdlm.config import SampleConfig

    add_dataclass_options(p, SampleConfig)
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--raw-weights", action="store_true", help="use the raw weights instead of the EMA")
    p.add_argument("--device", default="auto", help="auto (cuda when torch sees one), cpu, cuda or cuda:N")


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", formatter_class=HelpFormatter, help="evaluate a run on a data file",
                       description="Accuracy on a Sudoku CSV (puzzle,solution) or Countdown JSONL (nums,target), detected "
                                   "from the file, with an accuracy-vs-steps plot; Gen PPL and entropy for text runs.")
    p.add_argument("run_dir", type=Path, help="run directory written by 'dihal hcdlm train'")
    p.add_argument("--data", type=Path, required=True, help="evaluation file (Sudoku CSV, Countdown JSONL or a .txt file for text)")
    p.add_argument("--out", type=Path, required=True, help="JSON report to write")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N records")
    p.add_argument("--steps-sweep", type=comma_integers, default=[5, 10, 25, 50], help="step counts for the accuracy-vs-steps plot (empty = none)")
    p.add_argument("--samples", type=int, default=64, help="text: number of samples to score")
    p.add_argument("--evaluator", type=Path, default=None, help="text: evaluator LM for Gen PPL; the shipped backbone when omitted")
    p.add_argument("--no-diagnostics", action="store_true", help="skip the raw-vs-EMA comparison and (HC-DLM, Latent DM) the read-out accuracy after every sampling step")
    _add_sampling(p)
    p.set_defaults(func=run_eval)


def _add_solve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("solve", formatter_class=HelpFormatter, help="solve one Sudoku or Countdown problem with a trained run",
                       description="Print the model's solution of one puzzle (Sudoku grid, '.' or 0 for blanks; or "
                                   "Countdown 'n1,n2,...,target'), checked exactly; 'no solution' when none exists.")
    p.add_argument("run_dir", type=Path, help="run directory written by 'dihal hcdlm train'")
    p.add_argument("puzzle", help="the puzzle text")
    _add_sampling(p)
    p.set_defaults(func=run_solve)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("hcdlm", formatter_class=HelpFormatter, help="hierarchical continuous diffusion LM (train, eval, solve)",
                                   description="HC-DLM and its baselines (MDM, Latent DM, AR) on Sudoku, Countdown and text.")
    sub = parser.add_subparsers(dest="hcdlm_command", metavar="ACTION", required=True)
    _add_train(sub)
    _add_eval(sub)
    _add_solve(sub)


def _backbone_dir(path: Path | None) -> str:
    from dihal_fast.backbone import default_model_dir

    return str(path if path is not None else default_model_dir())


def run_train(args: argparse.Namespace) -> int:
    from dihal_fast.backbone import default_corpus
    from dihal_fast.hcdlm.config import RunConfig
    from dihal_fast.hcdlm.trainer import train

    if args.steps < 1 or args.batch_size < 1:
        raise ValueError(f"--steps and --batch-size must be >= 1, got {args.steps}, {args.batch_size}")
    # The defaults that depend on other options (see the help of --text-files, --backbone, --slot-head).
    text = args.name == "text"
    args.text_files = [str(f) for f in args.text_files or []] or ([str(default_corpus())] if text else [])
    args.tokenizer_dir = _backbone_dir(args.tokenizer_dir) if text else ""
    if args.slot_head is None:
        args.slot_head = args.slot_aux_weight > 0
    config = dataclass_from_options(RunConfig, args)
    summary = train(args.out, config, deepspeed_config=args.deepspeed)
    print(f"trained {config.model.kind} on {config.task.name}: step {summary['step']}, "
          f"loss {summary.get('loss', float('nan')):.4f}, {summary['parameters']} parameters -> {args.out}")
    return 0


def _sample_config(args: argparse.Namespace, text: bool):
    from dihal_fast.hcdlm.config import SampleConfig

    temperature = args.temperature if args.temperature is not None else (1.0 if text else 0.0)
    return dataclass_from_options(SampleConfig, args, temperature=temperature)


def run_eval(args: argparse.Namespace) -> int:
    from dihal_fast.common import atomic_write_json
    from dihal_fast.common.rundir import check_output_file
    from dihal_fast.hcdlm.eval_data import examples_from_file, text_windows
    from dihal_fast.hcdlm.evaluate import accuracy_vs_steps, evaluate_examples, evaluate_text, load_run
    from dihal_fast.hcdlm.plots import plot_accuracy_vs_steps

    check_output_file(args.out)
    run = load_run(args.run_dir, use_ema=not args.raw_weights, device=args.device)
    is_text = run.config.task.name == "text"
    cfg = _sample_config(args, is_text)
    if is_text:
        reference = text_windows(run.task, args.data, args.samples)
        report = evaluate_text(run, args.samples, cfg, _backbone_dir(args.evaluator), reference, args.seed)
        print(f"{run.config.model.kind} text: gen_ppl {report['gen_ppl']:.2f}, entropy {report['entropy']:.3f} "
              f"(data: {report['data_reference']['gen_ppl']:.2f}, {report['data_reference']['entropy']:.3f})")
    else:
        examples = examples_from_file(run.task, args.data, args.limit)
        logger.info("evaluating %s (step %d) on %d examples from %s", run.config.model.kind, run.step, len(examples), args.data)
        report = evaluate_examples(run, examples, cfg, args.seed)
        sweep = [s for s in args.steps_sweep if s != cfg.steps]
        if sweep:
            rows = accuracy_vs_steps(run, examples, sweep, cfg, args.seed)
            main_row = {"steps": cfg.steps, "accuracy": report["accuracy"], "groups": report["groups"], "seconds_per_batch": report["seconds_per_batch"]}
            report["accuracy_vs_steps"] = sorted(rows + [main_row], key=lambda r: r["steps"])
            plot = args.out.with_suffix(".steps.png")
            plot_accuracy_vs_steps({run.config.model.kind: report["accuracy_vs_steps"]}, plot, f"{run.config.task.name}: {args.data.name}")
            report["plot"] = str(plot)
        if not args.no_diagnostics:
            report.update(_diagnostics(args, run, examples, cfg, report))
        print(f"{run.config.model.kind} on {args.data.name}: accuracy {report['accuracy']:.4f} (n={report['n']})")
    report.update({"run": str(args.run_dir), "step": run.step, "data": str(args.data), "model": run.config.model.kind})
    atomic_write_json(args.out, report)
    return 0


def _diagnostics(args: argparse.Namespace, run, examples: list, cfg, report: dict) -> dict:
    """Raw vs EMA weights at the main settings and, for latent models, the read-out after every step (JSON + PNG)."""
    from dihal_fast.hcdlm.evaluate import evaluate_examples, load_run, readout_by_step
    from dihal_fast.hcdlm.plots import plot_readout_by_step

    used, other = ("raw", "ema") if args.raw_weights else ("ema", "raw")
    other_run = load_run(args.run_dir, use_ema=args.raw_weights, device=args.device)
    other_report = evaluate_examples(other_run, examples, cfg, args.seed, show=0)
    out = {"weights": {used: {"accuracy": report["accuracy"], "groups": report["groups"]},
                       other: {"accuracy": other_report["accuracy"], "groups": other_report["groups"]}}}
    logger.info("weights: %s %.4f, %s %.4f", used, report["accuracy"], other, other_report["accuracy"])
    if run.config.model.kind in ("hcdlm", "latent"):
        rows = readout_by_step(run, examples, cfg, args.seed)
        plot = plot_readout_by_step(rows, args.out.with_suffix(".readout.png"), f"{run.config.model.kind}: read-out after each step")
        out.update({"readout_by_step": rows, "readout_plot": str(plot)})
        logger.info("read-out accuracy: first step %.4f, last step %.4f", rows[0]["accuracy"], rows[-1]["accuracy"])
    return out


def run_solve(args: argparse.Namespace) -> int:
    import torch

    from dihal_fast.hcdlm.evaluate import load_run, sample_targets
    from dihal_fast.tasks.countdown import parse_problem, solve as solve_countdown
    from dihal_fast.tasks.sudoku import format_grid, parse_grid, solve_all

    run = load_run(args.run_dir, use_ema=not args.raw_weights, device=args.device)
    name = run.config.task.name
    if name == "text":
        raise ValueError("'solve' is for Sudoku and Countdown runs; this run was trained on text")
    if name == "sudoku":
        puzzle = parse_grid(args.puzzle, run.task.geo)
        exact = solve_all(puzzle, run.task.geo, limit=1)
        if not exact:
            print("no solution")
            return 0
        example = run.task.example(puzzle, exact[0], "input")
    else:
        problem = parse_problem(args.puzzle)
        if solve_countdown(problem) is None:
            print("no solution")
            return 0
        example = run.task.example(problem, "input")
    target, _ = sample_targets(run, torch.tensor([example.context]), _sample_config(args, False), args.seed)
    flags = run.task.score(example, target[0])
    print(run.task.render(target[0]) if name == "countdown" else format_grid(run.task.grid(target[0]), pretty=True, geo=run.task.geo))
    checks = ", ".join(f"{k}={('yes' if v else 'no') if isinstance(v, bool) else f'{100 * v:.0f}%'}" for k, v in flags.items() if k != "correct")
    print(f"check: {'correct' if flags['correct'] else 'WRONG'} ({checks})")
    return 0
