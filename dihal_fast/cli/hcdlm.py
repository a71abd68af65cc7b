"""``dihal hcdlm train|eval|solve``: HC-DLM and its baselines on Sudoku, Countdown and text."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from dihal_fast.common.devices import DEVICE_HELP
from dihal_fast.common.options import HelpFormatter, add_dataclass_options, comma_integers, dataclass_from_options

logger = logging.getLogger(__name__)


def comma_floats(text: str) -> list[float]:
    """``"0.05,0.5"`` -> ``[0.05, 0.5]`` (``""`` -> ``[]``)."""
    try:
        return [float(value) for value in text.split(",") if value.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _add_train(sub: argparse._SubParsersAction) -> None:
    from dihal_fast.hcdlm.config import RunConfig
    from dihal_fast.train.settings import DEEPSPEED_HELP

    p = sub.add_parser(
        "train",
        formatter_class=HelpFormatter,
        help="train (or resume) a model on a task",
        description="Train HC-DLM or a baseline; rerunning with the same --out resumes from the newest "
        "checkpoint. Several processes with DeepSpeed ZeRO: torchrun --nproc_per_node N "
        "$(which dihal) hcdlm train --deepspeed CFG ...",
    )
    p.add_argument("--out", type=Path, required=True, help="run directory (checkpoints/, config.json, log.jsonl)")
    p.add_argument("--deepspeed", default=None, metavar="CFG", help=DEEPSPEED_HELP)
    add_dataclass_options(p, RunConfig)
    p.set_defaults(func=run_train)


def _add_sampling(p: argparse.ArgumentParser) -> None:
    from dihal_fast.hcdlm.config import SampleConfig

    add_dataclass_options(p, SampleConfig)
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--raw-weights", action="store_true", help="use the raw weights instead of the EMA")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        formatter_class=HelpFormatter,
        help="evaluate a run on a data file",
        description="Accuracy on a Sudoku CSV (puzzle,solution) or Countdown JSONL (nums,target), detected "
        "from the file, with an accuracy-vs-steps plot; Gen PPL and entropy for text runs.",
    )
    p.add_argument("run_dir", type=Path, help="run directory written by 'dihal hcdlm train'")
    p.add_argument(
        "--data", type=Path, required=True, help="evaluation file (Sudoku CSV, Countdown JSONL or a .txt file for text)"
    )
    p.add_argument("--out", type=Path, required=True, help="JSON report to write")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N records")
    p.add_argument(
        "--steps-sweep",
        type=comma_integers,
        default=[5, 10, 25, 50],
        help="step counts for the accuracy-vs-steps plot (empty = none)",
    )
    p.add_argument("--samples", type=int, default=64, help="text: number of samples to score")
    p.add_argument(
        "--evaluator", type=Path, default=None, help="text: evaluator LM for Gen PPL; the shipped backbone when omitted"
    )
    p.add_argument(
        "--no-diagnostics",
        action="store_true",
        help="skip the raw-vs-EMA comparison, the read-out after every sampling step and the input ablations",
    )
    p.add_argument(
        "--compare",
        type=Path,
        default=None,
        metavar="RUN",
        help="another run on the same task (e.g. MDM): its "
        "accuracy against steps and its decoded answer per normalised step beside this run's, same puzzles",
    )
    p.add_argument(
        "--noise-levels",
        type=comma_floats,
        default=[0.05, 0.25, 0.5, 0.75, 0.95],
        help="Sudoku, latent models: noise levels of the ablations (x_t -> noise, scaffold -> true / random tokens; "
        "empty = none)",
    )
    _add_sampling(p)
    p.set_defaults(func=run_eval)


def _add_solve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "solve",
        formatter_class=HelpFormatter,
        help="solve one Sudoku or Countdown problem with a trained run",
        description="Print the model's solution of one puzzle (Sudoku grid, '.' or 0 for blanks; or "
        "Countdown 'n1,n2,...,target'), checked exactly; 'no solution' when none exists.",
    )
    p.add_argument("run_dir", type=Path, help="run directory written by 'dihal hcdlm train'")
    p.add_argument("puzzle", help="the puzzle text")
    _add_sampling(p)
    p.set_defaults(func=run_solve)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "hcdlm",
        formatter_class=HelpFormatter,
        help="hierarchical continuous diffusion LM (train, eval, solve)",
        description="HC-DLM and its baselines (MDM, Latent DM, CCDD, AR) on Sudoku, Countdown and text.",
    )
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
    summary = train(config, args.out, deepspeed_config=args.deepspeed)
    print(
        f"trained {config.model.kind} on {config.task.name}: step {summary['step']}, "
        f"loss {summary.get('loss', float('nan')):.4f}, {summary['parameters']} parameters -> {args.out}"
    )
    return 0


def _sample_config(args: argparse.Namespace, text: bool):
    from dihal_fast.hcdlm.config import SampleConfig

    temperature = args.temperature if args.temperature is not None else (1.0 if text else 0.0)
    return dataclass_from_options(SampleConfig, args, temperature=temperature)


def run_eval(args: argparse.Namespace) -> int:
    from dihal_fast.common import read_json
    from dihal_fast.hcdlm.api import evaluate_run

    saved = args.run_dir / "config.json"  # the default temperature depends on the run's task
    text = saved.is_file() and read_json(saved, "run config").get("task", {}).get("name") == "text"
    report = evaluate_run(
        args.run_dir,
        args.data,
        args.out,
        _sample_config(args, text),
        limit=args.limit,
        steps_sweep=tuple(args.steps_sweep),
        samples=args.samples,
        evaluator=args.evaluator,
        diagnostics=not args.no_diagnostics,
        seed=args.seed,
        raw_weights=args.raw_weights,
        device=args.device,
        compare=args.compare,
        noise_levels=tuple(args.noise_levels),
    )
    if "gen_ppl" in report:
        print(
            f"{report['model']} text: gen_ppl {report['gen_ppl']:.2f}, entropy {report['entropy']:.3f} "
            f"(data: {report['data_reference']['gen_ppl']:.2f}, {report['data_reference']['entropy']:.3f})"
        )
    else:
        print(f"{report['model']} on {args.data.name}: accuracy {report['accuracy']:.4f} (n={report['n']})")
        if "compare" in report:
            print(f"{report['compare']['model']} (--compare) on the same: accuracy {report['compare']['accuracy']:.4f}")
        if "ablation_effects" in report:
            effects = ", ".join(f"{k} {100 * v:+.1f}" for k, v in report["ablation_effects"].items())
            print(f"ablations, largest change of {report['ablation_key']} (points): {effects}")
    return 0


def run_solve(args: argparse.Namespace) -> int:
    from dihal_fast.hcdlm.api import solve_puzzle

    solution = solve_puzzle(
        args.run_dir,
        args.puzzle,
        _sample_config(args, False),
        seed=args.seed,
        raw_weights=args.raw_weights,
        device=args.device,
    )
    if solution is None:
        print("no solution")
        return 0
    print(solution.text)
    flags = solution.checks
    checks = ", ".join(
        f"{k}={('yes' if v else 'no') if isinstance(v, bool) else f'{100 * v:.0f}%'}"
        for k, v in flags.items()
        if k != "correct"
    )
    print(f"check: {'correct' if flags['correct'] else 'WRONG'} ({checks})")
    return 0
