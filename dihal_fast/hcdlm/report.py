"""What ``dihal hcdlm eval`` and ``dihal hcdlm solve`` do, as functions other programs can call:
:func:`evaluate_run` (a JSON-ready report with plots and diagnostics) and :func:`solve_puzzle`."""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dihal_fast.common import atomic_write_json
from dihal_fast.common.assets import default_model_dir
from dihal_fast.common.rundir import check_output_file
from dihal_fast.hcdlm.config import SampleConfig
from dihal_fast.hcdlm.eval_data import examples_from_file, text_windows
from dihal_fast.hcdlm.evaluate import (
    LoadedRun,
    accuracy_vs_steps,
    evaluate_examples,
    evaluate_text,
    load_run,
    readout_by_step,
    sample_targets,
)
from dihal_fast.hcdlm.plots import plot_accuracy_vs_steps, plot_readout_by_step

logger = logging.getLogger(__name__)


def _with_temperature(sample: SampleConfig | None, text: bool) -> SampleConfig:
    """``sample``, or the defaults with temperature 1 for text and 0 (argmax) for puzzles."""
    return sample if sample is not None else replace(SampleConfig(), temperature=1.0 if text else 0.0)


def evaluate_run(run_dir: str | Path, data: str | Path, out: str | Path, sample: SampleConfig | None = None, *,
                 limit: int | None = None, steps_sweep: tuple[int, ...] = (5, 10, 25, 50), samples: int = 64,
                 evaluator: str | Path | None = None, diagnostics: bool = True, seed: int = 0, raw_weights: bool = False,
                 device: str = "auto") -> dict:
    """Score the newest checkpoint of ``run_dir`` on ``data`` and write the report to ``out`` (JSON).

    Puzzles (a Sudoku CSV or Countdown JSONL): accuracy overall and per group, accuracy against sampling
    steps (``out`` with ``.steps.png``), and with ``diagnostics`` the other weight set (raw vs EMA) and, for
    latent models, the read-out after every sampling step (``.readout.png``). Text: Gen PPL and entropy
    of ``samples`` samples under ``evaluator`` (the shipped backbone when None), beside the data's own.
    """
    out = check_output_file(out)
    data = Path(data)
    run = load_run(run_dir, use_ema=not raw_weights, device=device)
    sample = _with_temperature(sample, run.config.task.name == "text")
    if run.config.task.name == "text":
        reference = text_windows(run.task, data, samples)
        report = evaluate_text(run, samples, sample, str(evaluator or default_model_dir()), reference, seed)
    else:
        examples = examples_from_file(run.task, data, limit)
        logger.info("evaluating %s (step %d) on %d examples from %s", run.config.model.kind, run.step, len(examples), data)
        report = evaluate_examples(run, examples, sample, seed)
        sweep = [s for s in steps_sweep if s != sample.steps]
        if sweep:
            rows = accuracy_vs_steps(run, examples, sweep, sample, seed)
            main_row = {"steps": sample.steps, "accuracy": report["accuracy"], "groups": report["groups"],
                        "seconds_per_batch": report["seconds_per_batch"]}
            report["accuracy_vs_steps"] = sorted(rows + [main_row], key=lambda r: r["steps"])
            plot = out.with_suffix(".steps.png")
            plot_accuracy_vs_steps({run.config.model.kind: report["accuracy_vs_steps"]}, plot, f"{run.config.task.name}: {data.name}")
            report["plot"] = str(plot)
        if diagnostics:
            report.update(_diagnostics(run_dir, run, examples, sample, report, out, seed, raw_weights, device))
    report.update({"run": str(run_dir), "step": run.step, "data": str(data), "model": run.config.model.kind})
    atomic_write_json(out, report)
    return report


def _diagnostics(run_dir, run: LoadedRun, examples: list, sample: SampleConfig, report: dict, out: Path, seed: int,
                 raw_weights: bool, device: str) -> dict:
    """Raw vs EMA weights at the main settings and, for latent models, the read-out after every step (JSON + PNG)."""
    used, other = ("raw", "ema") if raw_weights else ("ema", "raw")
    other_report = evaluate_examples(load_run(run_dir, use_ema=raw_weights, device=device), examples, sample, seed, show=0)
    found = {"weights": {used: {"accuracy": report["accuracy"], "groups": report["groups"]},
                         other: {"accuracy": other_report["accuracy"], "groups": other_report["groups"]}}}
    logger.info("weights: %s %.4f, %s %.4f", used, report["accuracy"], other, other_report["accuracy"])
    if run.config.model.kind in ("hcdlm", "latent"):
        rows = readout_by_step(run, examples, sample, seed)
        plot = plot_readout_by_step(rows, out.with_suffix(".readout.png"), f"{run.config.model.kind}: read-out after each step")
        found.update({"readout_by_step": rows, "readout_plot": str(plot)})
        logger.info("read-out accuracy: first step %.4f, last step %.4f", rows[0]["accuracy"], rows[-1]["accuracy"])
    return found


@dataclass
class Solution:
    """A model's answer to one puzzle: its rendering and the exact checks (``correct`` and the task's others)."""

    text: str
    checks: dict


def solve_puzzle(run_dir: str | Path, puzzle: str, sample: SampleConfig | None = None, *, seed: int = 0,
                 raw_weights: bool = False, device: str = "auto") -> Solution | None:
    """The run's answer to one Sudoku grid ('.' or 0 for blanks) or Countdown problem ('n1,n2,...,target'),
    checked exactly; None when the puzzle has no solution at all. Bad puzzle text is a ValueError."""
    from dihal_fast.tasks.countdown import parse_problem, solve as solve_countdown
    from dihal_fast.tasks.sudoku import format_grid, parse_grid, solve_all

    run = load_run(run_dir, use_ema=not raw_weights, device=device)
    name = run.config.task.name
    if name == "text":
        raise ValueError("'solve' is for Sudoku and Countdown runs; this run was trained on text")
    if name == "sudoku":
        grid = parse_grid(puzzle, run.task.geo)
        exact = solve_all(grid, run.task.geo, limit=1)
        if not exact:
            return None
        example = run.task.example(grid, exact[0], "input")
    else:
        problem = parse_problem(puzzle)
        if solve_countdown(problem) is None:
            return None
        example = run.task.example(problem, "input")
    target, _ = sample_targets(run, torch.tensor([example.context]), _with_temperature(sample, False), seed)
    text = run.task.render(target[0]) if name == "countdown" else format_grid(run.task.grid(target[0]), pretty=True, geo=run.task.geo)
    return Solution(text, run.task.score(example, target[0]))
