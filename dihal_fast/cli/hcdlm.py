"""``dihal hcdlm train|eval|solve``: HC-DLM and its baselines on Sudoku, Countdown and text."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from dihal_fast.common.options import HelpFormatter, add_dataclass_options, dataclass_from_options
from dihal_fast.common.rundir import path_argument
from dihal_fast.errors import DihalValueError

logger = logging.getLogger(__name__)


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
    p.add_argument(
        "--out", type=path_argument, required=True, help="run directory (checkpoints/, config.json, log.jsonl)"
    )
    p.add_argument("--deepspeed", default=None, metavar="CFG", help=DEEPSPEED_HELP)
    add_dataclass_options(p, RunConfig)
    p.set_defaults(func=run_train)


def _add_eval(sub: argparse._SubParsersAction) -> None:
    from dihal_fast.hcdlm.eval_config import HCDLMEvalConfig

    p = sub.add_parser(
        "eval",
        formatter_class=HelpFormatter,
        help="evaluate a run on a data file",
        description="Accuracy on a Sudoku CSV (puzzle,solution) or Countdown JSONL (nums,target), detected "
        "from the file, with an accuracy-vs-steps plot (with --best-of K: one chain, best-of-K and oracle@K side by "
        "side, the K chains from the kind's default diversity source unless --temperature or --reveal-noise gives "
        "one); Gen PPL and entropy for text runs.",
    )
    p.add_argument("--out", type=path_argument, required=True, help="JSON report to write")
    add_dataclass_options(p, HCDLMEvalConfig)
    p.set_defaults(func=run_eval)


def _add_solve(sub: argparse._SubParsersAction) -> None:
    from dihal_fast.hcdlm.eval_config import HCDLMSolveConfig

    p = sub.add_parser(
        "solve",
        formatter_class=HelpFormatter,
        help="solve one Sudoku or Countdown problem with a trained run",
        description="Print the model's solution of one puzzle (Sudoku grid, '.' or 0 for blanks; or "
        "Countdown 'n1,n2,...,target'), checked exactly; 'no solution' when none exists.",
    )
    add_dataclass_options(p, HCDLMSolveConfig)
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


def run_train(args: argparse.Namespace) -> int:
    from dihal_fast.hcdlm.config import RunConfig, check_read_fields, fill_task_defaults
    from dihal_fast.hcdlm.trainer import train

    if args.steps < 1 or args.batch_size < 1:
        raise DihalValueError(f"--steps and --batch-size must be >= 1, got {args.steps}, {args.batch_size}")
    check_read_fields(vars(args))  # before any work: a flag this --model never reads
    fill_task_defaults(vars(args))  # the flags whose default depends on the task, as RunConfig.for_task
    config = dataclass_from_options(RunConfig, args)
    summary = train(config, args.out, deepspeed_config=args.deepspeed)
    print(
        f"trained {config.model.kind} on {config.task.name}: step {summary['step']}, "
        f"loss {summary.get('loss', float('nan')):.4f}, {summary['elapsed_s']:.1f} s of {summary['budget_clock']} "
        f"time, {summary['parameters']} parameters (the HC-DLM of these fields: {summary['hcdlm_parameters']}) "
        f"-> {args.out}"
    )
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from dihal_fast.hcdlm.api import evaluate_run
    from dihal_fast.hcdlm.eval_config import HCDLMEvalConfig
    from dihal_fast.hcdlm.stats import points_text

    report = evaluate_run(dataclass_from_options(HCDLMEvalConfig, args), args.out)
    if "gen_ppl" in report:
        print(
            f"{report['model']} text: gen_ppl {report['gen_ppl']:.2f}, entropy {report['entropy']:.3f} "
            f"(data: {report['data_reference']['gen_ppl']:.2f}, {report['data_reference']['entropy']:.3f})"
        )
    else:
        print(f"{report['model']} on {Path(args.data).name}: accuracy {report['accuracy']:.4f} (n={report['n']})")
        _print_rows(report.get("best_of", {}).get("rows", []))
        if "compare" in report:
            print(f"{report['compare']['model']} (--compare) on the same: accuracy {report['compare']['accuracy']:.4f}")
            _print_rows(report["compare"].get("best_of", {}).get("rows", []))
        if "protocol" in report:
            print("protocol (settings chosen on --validation):")
            _print_rows(report["protocol"]["rows"])
        if "interventions" in report:
            found = report["interventions"]
            variants = ", ".join(f"{k} {100 * v['accuracy']:.1f}" for k, v in found["variants"].items())
            print(
                f"in-sampler interventions, accuracy %: {variants}; normal - latent_reencoded "
                f"{points_text(found['latent_beyond_tokens'])}"
            )
        if "oracle_ablation_effects" in report:
            effects = ", ".join(f"{k} {100 * v:+.1f}" for k, v in report["oracle_ablation_effects"].items())
            print(
                f"oracle ablations (x_t from the true answer), largest change of {report['oracle_ablation_key']} "
                f"(points): {effects}"
            )
    return 0


def _print_rows(rows: list[dict]) -> None:
    """One line per row of single chain / best-of-K / oracle@K: accuracy, cost per puzzle and settings."""
    for row in rows:
        print(
            f"  {row['mode']:8s} K={row['k']}: accuracy {row['accuracy']:.4f}, {row['passes']:.0f} passes / "
            f"{row['block_passes']:.0f} block passes per puzzle ({row['settings']})"
        )


def run_solve(args: argparse.Namespace) -> int:
    from dihal_fast.hcdlm.api import solve_puzzle
    from dihal_fast.hcdlm.eval_config import HCDLMSolveConfig

    solution = solve_puzzle(dataclass_from_options(HCDLMSolveConfig, args))
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
