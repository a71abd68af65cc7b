"""``dihal hcdlm train|eval|solve``: HC-DLM and its baselines on Sudoku, Countdown and text."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

logger = logging.getLogger(__name__)
FMT = argparse.ArgumentDefaultsHelpFormatter


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _add_train(sub: argparse._SubParsersAction) -> None:
    from dihal_fast.hcdlm.config import CONT_WEIGHTINGS, KERNELS, MODEL_KINDS, TOKEN_WEIGHTINGS, ModelConfig, ObjectiveConfig, TrainConfig
    from dihal_fast.tasks.registry import TASKS, TaskConfig

    m, o, t, k = ModelConfig(), ObjectiveConfig(), TrainConfig(), TaskConfig()
    p = sub.add_parser("train", formatter_class=FMT, help="train (or resume) a model on a task",
                       description="Train HC-DLM or a baseline; rerunning with the same --out resumes from the newest checkpoint.")
    p.add_argument("--task", choices=TASKS, required=True, help="task to train on")
    p.add_argument("--model", choices=MODEL_KINDS, default=m.kind, help="hcdlm, mdm (masked diffusion), latent (Latent DM: no token scaffold) or ar")
    p.add_argument("--out", type=Path, required=True, help="run directory (checkpoints/, config.json, log.jsonl)")
    p.add_argument("--steps", type=int, default=t.steps, help="optimizer steps in total")
    p.add_argument("--max-minutes", type=float, default=t.max_minutes, help="stop after this much training time (0 = no limit)")
    p.add_argument("--budget-clock", choices=["wall", "cpu"], default=t.budget_clock, help="what --max-minutes measures: wall-clock or process CPU time")
    p.add_argument("--batch-size", type=int, default=t.batch_size, help="examples per step")
    p.add_argument("--lr", type=float, default=t.lr, help="AdamW learning rate")
    p.add_argument("--ema", type=float, default=t.ema, help="EMA decay of the evaluation weights")
    p.add_argument("--seed", type=int, default=t.seed, help="random seed (data, noise, initialisation)")
    p.add_argument("--threads", type=int, default=t.threads, help="torch CPU threads (0 = torch default)")
    p.add_argument("--device", default=t.device, help="auto (cuda when torch sees one), cpu, cuda or cuda:N; a run resumes on the device type it started on")
    p.add_argument("--checkpoint-every", type=int, default=t.checkpoint_every, help="steps between checkpoints")
    p.add_argument("--kernel", choices=KERNELS, default=m.kernel, help="discrete forward kernel of the token scaffold")
    p.add_argument("--latents", type=int, default=m.latents, help="M, number of continuous latent vectors")
    p.add_argument("--latent-dim", type=int, default=m.latent_dim, help="d, size of each latent vector")
    p.add_argument("--hidden", type=int, default=m.hidden, help="transformer width of every module")
    p.add_argument("--heads", type=int, default=m.heads, help="attention heads")
    p.add_argument("--encoder-blocks", type=int, default=m.encoder_blocks, help="blocks of the encoder q(x0|k0)")
    p.add_argument("--denoiser-blocks", type=int, default=m.denoiser_blocks, help="DiT blocks of the denoiser")
    p.add_argument("--predictor-blocks", type=int, default=m.predictor_blocks, help="blocks of the token predictor p(k0|x0)")
    p.add_argument("--baseline-blocks", type=int, default=m.baseline_blocks, help="blocks of MDM/AR (0 = match the HC-DLM parameter count)")
    p.add_argument("--dropout", type=float, default=m.dropout, help="dropout rate")
    p.add_argument("--lambda-recon", type=float, default=o.lambda_recon, help="weight of the token reconstruction CE")
    p.add_argument("--lambda-ent", type=float, default=o.lambda_ent, help="weight of the encoder's E[log q] (entropy regulariser)")
    p.add_argument("--lambda-cont", type=float, default=o.lambda_cont, help="weight of the latent x0-regression")
    p.add_argument("--lambda-token", type=float, default=o.lambda_token, help="weight of the per-step token term -log p(k0 | x_hat_0(x_t, k_t, t)), trained through denoiser and predictor (0 = off)")
    p.add_argument("--token-weighting", choices=TOKEN_WEIGHTINGS, default=o.token_weighting, help="per-step token term: 'all' positions (mean CE) or 'schedule' (corrupted positions weighted by 1/s, the masked-diffusion ELBO)")
    p.add_argument("--cont-weighting", choices=CONT_WEIGHTINGS, default=o.cont_weighting, help="omega_t of the latent regression: 'none' or 'min_snr' (min(SNR, 5) / 5)")
    p.add_argument("--exposure-share", type=float, default=o.exposure_share, help="share of each batch whose x_t and scaffold are built from the model's own no-grad prediction at a higher noise level (0 = the paper's training)")
    p.add_argument("--slot-aux-weight", type=float, default=o.slot_aux_weight, help="weight of a training-only per-slot token head on the denoiser (deep supervision, not in the paper; 0 = no head, the paper's model)")
    p.add_argument("--scaffold-drop", type=float, default=o.scaffold_drop, help="share of scaffolds replaced by random tokens (for guidance)")
    p.add_argument("--sudoku-box", default=k.sudoku_box, help="Sudoku box shape: 3x3 (9x9 grid), 2x3 (6x6) or 2x2 (4x4)")
    p.add_argument("--sudoku-pool", type=int, default=k.sudoku_pool, help="generated training puzzles (augmented by symmetries)")
    p.add_argument("--sudoku-difficulty", default=k.sudoku_train_difficulty, choices=["singles", "advanced", "search", "hard"], help="grade of the training puzzles")
    p.add_argument("--countdown-numbers", type=_int_list, default=k.countdown_numbers, help="numbers per training problem, e.g. 3,4")
    p.add_argument("--countdown-len", type=int, default=k.countdown_target_len, help="solution length in characters (0 = room for the largest problem)")
    p.add_argument("--text-files", nargs="+", default=None, help="training text files; the shipped default corpus when omitted")
    p.add_argument("--text-len", type=int, default=k.text_len, help="tokens per text sample")
    p.add_argument("--text-max-chars", type=int, default=k.text_max_chars, help="read at most this many characters per file (0 = all)")
    p.add_argument("--backbone", type=Path, default=None, help="checkpoint whose tokenizer the text task uses; the shipped backbone when omitted")
    p.set_defaults(func=run_train)


def _add_sampling(p: argparse.ArgumentParser) -> None:
    from dihal_fast.hcdlm.config import REMASKS, SampleConfig

    s = SampleConfig()
    p.add_argument("--steps", type=int, default=s.steps, help="sampling steps (diffusion models)")
    p.add_argument("--cfg-weight", type=float, default=s.cfg_weight, help="classifier-free guidance weight on the scaffold (0 = off; paper 2.75)")
    p.add_argument("--remask", choices=REMASKS, default=s.remask, help="HC-DLM: which scaffold tokens are re-noised each step: random (each with prob. s), confidence (the least confident), auto (the paper's: random for the uniform kernel, confidence for absorbing)")
    p.add_argument("--order", choices=["prob", "margin"], default=s.order, help="MDM unmasking order: top-probability or top-probability margin")
    p.add_argument("--clamp", action="store_true", help="HC-DLM: replace x_hat_0 at every step by the encoder mean of its argmax tokens (not in the paper)")
    p.add_argument("--temperature", type=float, default=None, help="token sampling temperature, float64; when omitted 0 (argmax) for puzzles and 1 for text")
    p.add_argument("--batch-size", type=int, default=s.batch_size, help="examples per sampling batch")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--raw-weights", action="store_true", help="use the raw weights instead of the EMA")
    p.add_argument("--device", default="auto", help="auto (cuda when torch sees one), cpu, cuda or cuda:N")


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", formatter_class=FMT, help="evaluate a run on a data file",
                       description="Accuracy on a Sudoku CSV (puzzle,solution) or Countdown JSONL (nums,target), detected "
                                   "from the file, with an accuracy-vs-steps plot; Gen PPL and entropy for text runs.")
    p.add_argument("run_dir", type=Path, help="run directory written by 'dihal hcdlm train'")
    p.add_argument("--data", type=Path, required=True, help="evaluation file (Sudoku CSV, Countdown JSONL or a .txt file for text)")
    p.add_argument("--out", type=Path, required=True, help="JSON report to write")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N records")
    p.add_argument("--steps-sweep", type=_int_list, default=[5, 10, 25, 50], help="step counts for the accuracy-vs-steps plot (empty = none)")
    p.add_argument("--samples", type=int, default=64, help="text: number of samples to score")
    p.add_argument("--evaluator", type=Path, default=None, help="text: evaluator LM for Gen PPL; the shipped backbone when omitted")
    p.add_argument("--no-diagnostics", action="store_true", help="skip the raw-vs-EMA comparison and (HC-DLM, Latent DM) the read-out accuracy after every sampling step")
    _add_sampling(p)
    p.set_defaults(func=run_eval)


def _add_solve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("solve", formatter_class=FMT, help="solve one Sudoku or Countdown problem with a trained run",
                       description="Print the model's solution of one puzzle (Sudoku grid, '.' or 0 for blanks; or "
                                   "Countdown 'n1,n2,...,target'), checked exactly; 'no solution' when none exists.")
    p.add_argument("run_dir", type=Path, help="run directory written by 'dihal hcdlm train'")
    p.add_argument("puzzle", help="the puzzle text")
    _add_sampling(p)
    p.set_defaults(func=run_solve)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("hcdlm", formatter_class=FMT, help="hierarchical continuous diffusion LM (train, eval, solve)",
                                   description="HC-DLM and its baselines (MDM, Latent DM, AR) on Sudoku, Countdown and text.")
    sub = parser.add_subparsers(dest="hcdlm_command", metavar="ACTION", required=True)
    _add_train(sub)
    _add_eval(sub)
    _add_solve(sub)


def _backbone_dir(path: Path | None) -> str:
    from dihal_fast.backbone import default_model_dir

    return str(path if path is not None else default_model_dir())


def run_train(args: argparse.Namespace) -> int:
    from dihal_fast.hcdlm.config import ModelConfig, ObjectiveConfig, RunConfig, TrainConfig
    from dihal_fast.hcdlm.trainer import train
    from dihal_fast.tasks.registry import TaskConfig

    from dihal_fast.backbone import default_corpus

    text_files = [str(f) for f in (args.text_files or [])]
    if args.task == "text" and not text_files:
        text_files = [str(default_corpus())]
    if args.steps < 1 or args.batch_size < 1:
        raise ValueError(f"--steps and --batch-size must be >= 1, got {args.steps}, {args.batch_size}")
    config = RunConfig(
        task=TaskConfig(args.task, args.sudoku_box, args.sudoku_pool, args.sudoku_difficulty, list(args.countdown_numbers),
                        args.countdown_len, text_files, args.text_len, args.text_max_chars,
                        _backbone_dir(args.backbone) if args.task == "text" else ""),
        model=ModelConfig(args.model, args.hidden, args.heads, args.encoder_blocks, args.denoiser_blocks, args.predictor_blocks,
                          args.latents, args.latent_dim, args.kernel, args.dropout, args.baseline_blocks, slot_head=args.slot_aux_weight > 0),
        objective=ObjectiveConfig(args.lambda_recon, args.lambda_ent, args.lambda_cont, args.lambda_token, args.token_weighting,
                                  args.cont_weighting, scaffold_drop=args.scaffold_drop, exposure_share=args.exposure_share,
                                  slot_aux_weight=args.slot_aux_weight),
        train=TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, ema=args.ema, seed=args.seed,
                          max_minutes=args.max_minutes, budget_clock=args.budget_clock, checkpoint_every=args.checkpoint_every, threads=args.threads,
                          device=args.device),
    )
    summary = train(args.out, config)
    print(f"trained {args.model} on {args.task}: step {summary['step']}, loss {summary.get('loss', float('nan')):.4f}, "
          f"{summary['parameters']} parameters -> {args.out}")
    return 0


def _sample_config(args: argparse.Namespace, text: bool):
    from dihal_fast.hcdlm.config import SampleConfig

    temperature = args.temperature if args.temperature is not None else (1.0 if text else 0.0)
    return SampleConfig(args.steps, args.cfg_weight, args.remask, args.order, temperature, args.batch_size, args.clamp)


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
