"""What ``dihal hcdlm eval`` and ``dihal hcdlm solve`` do, as functions other programs can call:
:func:`evaluate_run` (a JSON-ready report with plots and diagnostics) and :func:`solve_puzzle`."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dihal_fast.common import atomic_write_json, read_json
from dihal_fast.common.assets import default_model_dir, model_location
from dihal_fast.common.reports import StageReport
from dihal_fast.common.rundir import check_output_file
from dihal_fast.common.validation import check_fields
from dihal_fast.errors import DihalTypeError, DihalValueError
from dihal_fast.hcdlm.config import SampleConfig
from dihal_fast.hcdlm.eval_config import HCDLMEvalConfig, HCDLMSolveConfig
from dihal_fast.hcdlm.eval_data import examples_from_file, text_windows
from dihal_fast.hcdlm.mechanism import (
    ablation_effects,
    ablation_readout,
    in_sampler_interventions,
    readout_trajectory,
)
from dihal_fast.hcdlm.models import kind_of, parameter_match
from dihal_fast.hcdlm.plots import plot_ablations, plot_accuracy_vs_steps, plot_readout_by_step, plot_trajectories
from dihal_fast.hcdlm.protocol import best_of_config, chosen_configs, protocol_choice, protocol_rows
from dihal_fast.hcdlm.scoring import (
    LoadedRun,
    accuracy_vs_steps,
    check_sampler,
    evaluate_examples,
    evaluate_text,
    load_run,
    readout_by_step,
    sample_targets,
)
from dihal_fast.tasks.registry import POOL_FILE
from dihal_fast.tasks.sudoku_splits import check_disjoint

logger = logging.getLogger(__name__)


def evaluate_run(config: HCDLMEvalConfig, out: str | Path) -> StageReport:
    """Score the newest checkpoint of ``config.run_dir`` on ``config.data``; writes the report to ``out`` (JSON) and
    returns it (a StageReport on ``out``).

    ``(config, out)`` like every entry point.

    Puzzles (a Sudoku CSV or Countdown JSONL): accuracy overall and per group of one chain, with ``sample.best_of``
    K > 1 also one chain, best-of-K and oracle@K side by side (``best_of``, :func:`best_of_rows`; with ``compare``,
    that run's too), accuracy against sampling steps (``out`` with ``.steps.png``; with ``compare``, another run
    (e.g. MDM) on the same puzzles in the same plot), and with ``diagnostics`` the other weight set (raw vs EMA),
    for latent models the read-out after every sampling step (``.readout.png``), the decoded answer per normalised
    step of this run and of ``compare`` (``trajectory``, ``.trajectory.png``) and, on Sudoku, the read-out at the fixed
    ``noise_levels`` with x_t or the scaffold replaced (``ablations``, ``.ablations.png``; see
    :mod:`dihal_fast.hcdlm.mechanism`). Text: Gen PPL and entropy of ``samples`` samples under
    ``evaluator`` (the shipped backbone when None), beside the data's own.
    """
    if not isinstance(config, HCDLMEvalConfig):
        raise DihalTypeError(f"evaluate_run takes an HCDLMEvalConfig, got {type(config).__name__}")
    check_fields(config)  # again: a config may have been changed since it was built
    run_dir, compare, seed, raw_weights, device = (
        config.run_dir,
        config.compare,
        config.seed,
        config.raw_weights,
        config.device,
    )
    evaluator = None if config.evaluator is None else model_location(config.evaluator)  # refused before any work
    out = check_output_file(out)
    data = Path(config.data)
    run = load_run(run_dir, use_ema=not raw_weights, device=device)
    other = load_run(compare, use_ema=not raw_weights, device=device) if compare is not None else None
    if other is not None and (other.config.task.name, other.task.spec) != (run.config.task.name, run.task.spec):
        raise DihalValueError(
            f"--compare {compare} was trained on another task ({other.config.task.name}) than {run_dir} "
            f"({run.config.task.name})"
        )
    sample = config.sampling(run.config.task.name == "text")
    k, single = sample.best_of, replace(sample, best_of=1)
    for loaded in (run, other):  # sampler options the run (or the compared one) cannot take: refused before any work
        if loaded is not None:
            check_sampler(loaded, single)
            check_sampler(loaded, best_of_config(loaded.model, sample, k))
    steps_sweep, noise_levels = tuple(config.steps_sweep), tuple(config.noise_levels)
    if run.config.task.name == "text":
        reference = text_windows(run.task, data, config.samples)
        text_sample = best_of_config(run.model, sample, k)
        report = evaluate_text(run, config.samples, text_sample, str(evaluator or default_model_dir()), reference, seed)
    else:
        examples = examples_from_file(run.task, data, config.limit)
        logger.info(
            "evaluating %s (step %d) on %d examples from %s", run.config.model.kind, run.step, len(examples), data
        )
        report = evaluate_examples(run, examples, single, seed)
        if k > 1:
            report["best_of"] = best_of_rows(run, examples, sample, seed)
        if config.protocol_k:
            validation = examples_from_file(run.task, config.validation)
            splits = check_run_splits(run, Path(run_dir), validation, examples)
            choice = protocol_choice(run, validation, single, config.protocol_k, tuple(config.steps_choices), seed)
            rows = protocol_rows(run, examples, *chosen_configs(choice["chosen"], single), seed)
            validation_sha256 = file_sha256(config.validation)
            report["protocol"] = {**choice, "rows": rows, "splits": splits, "validation_sha256": validation_sha256}
        curves = {_label(run): _steps_curve(run, examples, steps_sweep, single, seed, report)}
        if other is not None:
            other_report = evaluate_examples(other, examples, single, seed, show=0)
            curves[_label(other)] = _steps_curve(other, examples, steps_sweep, single, seed, other_report)
            report["compare"] = {
                "run": str(compare),
                "model": other.config.model.kind,
                "step": other.step,
                "accuracy": other_report["accuracy"],
                "groups": other_report["groups"],
            }
            if k > 1:
                report["compare"]["best_of"] = best_of_rows(other, examples, sample, seed)
        if len(curves[_label(run)]) > 1:
            report["accuracy_vs_steps"] = curves[_label(run)]
            if other is not None:
                report["compare"]["accuracy_vs_steps"] = curves[_label(other)]
            plot = out.with_suffix(".steps.png")
            plot_accuracy_vs_steps(curves, plot, f"{run.config.task.name}: {data.name}")
            report["plot"] = str(plot)
        if config.diagnostics:
            report.update(_diagnostics(run_dir, run, examples, single, report, out, seed, raw_weights, device))
            report.update(
                _mechanism(run, other, examples, single, out, seed, noise_levels, report.get("readout_by_step"))
            )
    report.update(
        {
            "run": str(run_dir),
            "step": run.step,
            "data": str(data),
            "data_sha256": file_sha256(data),
            "model": run.config.model.kind,
            "trained_s": run.trained_s,
            "budget_clock": run.config.train.budget_clock,
            **parameter_match(run.task.spec, run.config.model),
        }
    )
    atomic_write_json(out, report)
    return StageReport(out, report)


def best_of_rows(run: LoadedRun, examples: list, sample: SampleConfig, seed: int = 0) -> dict:
    """``{k, rows}``: one chain of ``sample``, best-of-K and oracle@K (K = ``sample.best_of``) side by side, the
    protocol's rows (:func:`~dihal_fast.hcdlm.protocol.protocol_rows`), the K chains from ``sample``'s own or the
    kind's default diversity source (:func:`~dihal_fast.hcdlm.protocol.best_of_config`), chosen by
    ``sample.verifier``."""
    k = sample.best_of
    diverse = best_of_config(run.model, sample, k)
    return {"k": k, "rows": protocol_rows(run, examples, replace(sample, best_of=1), diverse, seed)}


def file_sha256(path: str | Path) -> str:
    """sha256 (hex) of a data file's bytes: the name a record gives the set it was scored on."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_run_splits(run: LoadedRun, run_dir: Path, validation: list, examples: list) -> dict[str, int] | None:
    """Sudoku: refuse a validation set, data set and the run's training pool (when saved in the run) that share a
    puzzle up to the training symmetries (:func:`~dihal_fast.tasks.sudoku_splits.check_disjoint`); their sizes."""
    if run.config.task.name != "sudoku":
        return None
    splits: dict[str, list] = {}
    pool = run_dir / POOL_FILE
    if pool.is_file():
        splits["training pool"] = [tuple(map(tuple, pair)) for pair in read_json(pool, "puzzle pool")]
    splits["validation"] = [ex.payload for ex in validation]
    splits["data"] = [ex.payload for ex in examples]
    return check_disjoint(splits, run.task.geo)


def _label(run: LoadedRun) -> str:
    return (
        f"{run.config.model.kind} ({run.config.model.kernel})"
        if run.config.model.kind == "hcdlm"
        else run.config.model.kind
    )


def _steps_curve(
    run: LoadedRun, examples: list, steps_sweep: tuple[int, ...], sample: SampleConfig, seed: int, main: dict
) -> list[dict]:
    """Accuracy against sampling steps: the sweep plus the main row (already scored as ``main``)."""
    rows = accuracy_vs_steps(run, examples, [s for s in steps_sweep if s != sample.steps], sample, seed)
    main_row = {
        "steps": sample.steps,
        "accuracy": main["accuracy"],
        "groups": main["groups"],
        "seconds_per_batch": main["seconds_per_batch"],
    }
    return sorted(rows + [main_row], key=lambda r: r["steps"])


def _score_key(run: LoadedRun) -> str:
    """The partial-credit score plotted by the mechanism diagnostics."""
    return {"sudoku": "blank_cells", "countdown": "true_steps"}.get(run.config.task.name, "accuracy")


def _mechanism(
    run: LoadedRun,
    other: LoadedRun | None,
    examples: list,
    sample: SampleConfig,
    out: Path,
    seed: int,
    noise_levels: tuple[float, ...],
    readout: list[dict] | None,
) -> dict:
    """The decoded answer per normalised step (this run, from its ``readout`` when already traced, and
    ``other``), for latent models the in-sampler interventions (puzzles with an answer to score) and, on Sudoku, the
    oracle input ablations."""
    key, found = _score_key(run), {}
    if kind_of(run.model).latent and run.config.task.name != "text" and len(examples) >= 2:
        found["interventions"] = in_sampler_interventions(run, examples, sample, seed)
        logger.info(
            "in-sampler interventions (accuracy): %s",
            {name: round(v["accuracy"], 4) for name, v in found["interventions"]["variants"].items()},
        )
    trajectories = {
        _label(r): readout_trajectory(r, examples, sample, seed, rows=readout if r is run else None)
        for r in (run, other)
        if r is not None and kind_of(r.model).trace is not None
    }
    if trajectories:
        plot = plot_trajectories(
            trajectories, key, out.with_suffix(".trajectory.png"), f"{run.config.task.name}: decoded answer per step"
        )
        found.update({"trajectory": trajectories, "trajectory_plot": str(plot)})
    if run.config.task.name == "sudoku" and kind_of(run.model).latent and noise_levels:
        rows = ablation_readout(run, examples, tuple(noise_levels), seed)
        plot = plot_ablations(
            rows, key, out.with_suffix(".ablations.png"), f"{_label(run)}: oracle read-out with one input replaced"
        )
        found.update(
            {
                "oracle_ablations": rows,
                "oracle_ablation_effects": ablation_effects(rows, key),
                "oracle_ablation_key": key,
                "oracle_ablations_plot": str(plot),
            }
        )
        logger.info("oracle ablations (%s, largest change over s): %s", key, found["oracle_ablation_effects"])
    return found


def _diagnostics(
    run_dir,
    run: LoadedRun,
    examples: list,
    sample: SampleConfig,
    report: dict,
    out: Path,
    seed: int,
    raw_weights: bool,
    device: str,
) -> dict:
    """Raw vs EMA weights at the main settings and, for latent models, the read-out after every step (JSON + PNG)."""
    used, other = ("raw", "ema") if raw_weights else ("ema", "raw")
    other_report = evaluate_examples(
        load_run(run_dir, use_ema=raw_weights, device=device), examples, sample, seed, show=0
    )
    found = {
        "weights": {
            used: {"accuracy": report["accuracy"], "groups": report["groups"]},
            other: {"accuracy": other_report["accuracy"], "groups": other_report["groups"]},
        }
    }
    logger.info("weights: %s %.4f, %s %.4f", used, report["accuracy"], other, other_report["accuracy"])
    if kind_of(run.model).latent:
        rows = readout_by_step(run, examples, sample, seed)
        plot = plot_readout_by_step(
            rows, out.with_suffix(".readout.png"), f"{run.config.model.kind}: read-out after each step"
        )
        found.update({"readout_by_step": rows, "readout_plot": str(plot)})
        logger.info("read-out accuracy: first step %.4f, last step %.4f", rows[0]["accuracy"], rows[-1]["accuracy"])
    return found


@dataclass
class Solution:
    """A model's answer to one puzzle: its rendering and the exact checks (``correct`` and the task's others)."""

    text: str
    checks: dict


def solve_puzzle(config: HCDLMSolveConfig) -> Solution | None:
    """The run's answer to one Sudoku grid ('.' or 0 for blanks) or Countdown problem ('n1,n2,...,target'),
    checked exactly; None when the puzzle has no solution at all. Bad puzzle text is a DihalValueError."""
    from dihal_fast.tasks.countdown import parse_problem
    from dihal_fast.tasks.countdown import solve as solve_countdown
    from dihal_fast.tasks.sudoku import format_grid, parse_grid, solve_all

    if not isinstance(config, HCDLMSolveConfig):
        raise DihalTypeError(f"solve_puzzle takes an HCDLMSolveConfig, got {type(config).__name__}")
    check_fields(config)
    puzzle = config.puzzle
    run = load_run(config.run_dir, use_ema=not config.raw_weights, device=config.device)
    name = run.config.task.name
    if name == "text":
        raise DihalValueError("'solve' is for Sudoku and Countdown runs; this run was trained on text")
    if name == "sudoku":
        grid = parse_grid(puzzle, run.task.geo)
        exact = solve_all(grid, run.task.geo, limit=1)
        if not exact:
            return None
        example = run.task.example(grid, exact[0], "input")
    else:
        problem = parse_problem(puzzle)
        example = run.task.example(problem, "input")  # refuses a problem longer than the model's context first
        if solve_countdown(problem) is None:
            return None
    sample = config.sampling(False)
    sample = best_of_config(run.model, sample, sample.best_of)  # the kind's default diversity source if needed
    target, _ = sample_targets(run, torch.tensor([example.context]), sample, config.seed)
    text = (
        run.task.render(target[0])
        if name == "countdown"
        else format_grid(run.task.grid(target[0]), pretty=True, geo=run.task.geo)
    )
    return Solution(text, run.task.score(example, target[0]))
