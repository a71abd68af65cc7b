"""Evaluation of a trained run: puzzle accuracy (per group), accuracy against sampling steps (paper
Fig. 3b), sampling time per batch, and Gen PPL + entropy of text samples under an evaluator LM."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dihal_fast.common import resolve_device
from dihal_fast.common.progress import progress_bar
from dihal_fast.errors import DihalValueError
from dihal_fast.hcdlm.config import RunConfig, SampleConfig
from dihal_fast.hcdlm.models import build_model, check_sample, generate, kind_of
from dihal_fast.hcdlm.noise import AbsorbingKernel, UniformKernel, make_kernel
from dihal_fast.hcdlm.rules import RULE_TASKS
from dihal_fast.hcdlm.trainer import CONFIG_NAME, check_layout
from dihal_fast.tasks.base import EvalExample, Task
from dihal_fast.tasks.registry import build_task
from dihal_fast.train.checkpoint import checkpoint_state, latest_checkpoint, load_weights

logger = logging.getLogger(__name__)


@dataclass
class LoadedRun:
    config: RunConfig
    task: Task
    model: torch.nn.Module
    kernel: UniformKernel | AbsorbingKernel
    step: int
    device: torch.device
    trained_s: float = 0.0  # seconds trained on the run's budget clock (train.budget_clock)


def load_run(run_dir: str | Path, use_ema: bool = True, device: str = "cpu") -> LoadedRun:
    """The newest checkpoint of a run (EMA weights by default) on ``device``, with its task (no training data)."""
    run_dir = Path(run_dir)
    check_layout(run_dir)
    folder = latest_checkpoint(run_dir)
    if folder is None:
        raise FileNotFoundError(
            f"no checkpoint in {run_dir} (expected {run_dir}/checkpoints/latest from 'dihal hcdlm train')"
        )
    config = RunConfig.load(folder / CONFIG_NAME)
    task = build_task(config.task, for_training=False)
    model = build_model(task.spec, config.model)
    prefix = "model."  # the checkpoint holds the parameters of the model inside its training objective
    weights = load_weights(
        folder, use_ema=use_ema and config.train.ema_decay > 0
    )  # EMA decay 0: the EMA is the weights
    try:
        model.load_state_dict({name[len(prefix) :]: value for name, value in weights.items()})
    except RuntimeError as exc:
        raise DihalValueError(
            f"checkpoint {folder} does not fit this run's model: {str(exc).splitlines()[0]}"
        ) from None
    target = resolve_device(device)
    model.to(target).eval()
    state = checkpoint_state(folder)
    return LoadedRun(
        config,
        task,
        model,
        make_kernel(config.model.kernel, task.spec.target_vocab),
        state["step"],
        target,
        float(state.get("elapsed_s", 0.0)),
    )


def check_sampler(run: LoadedRun, cfg: SampleConfig) -> None:
    """Refuse guidance on an HC-DLM run whose unconditional branch was never trained (no scaffold drop), the rules
    verifier on a task without rules (text), and what the run's kind cannot take
    (:func:`~dihal_fast.hcdlm.models.check_sample`)."""
    check_sample(run.model, cfg)
    if cfg.verifier == "rules" and run.config.task.name not in RULE_TASKS:
        raise DihalValueError(
            f"--verifier rules checks the rules of {' and '.join(RULE_TASKS)} answers; this run's task "
            f"({run.config.task.name}) has none: use --verifier chain"
        )
    if cfg.cfg_weight and run.config.model.kind == "hcdlm" and not run.config.objective.guidance_training:
        raise DihalValueError(
            f"--cfg-weight {cfg.cfg_weight} needs a run trained with --guidance-training (its unconditional "
            "branch); this run was trained without it: sample with --cfg-weight 0"
        )


def sample_targets(
    run: LoadedRun, contexts: torch.Tensor, cfg: SampleConfig, seed: int = 0
) -> tuple[list[list[int]], float]:
    """Generated targets for ``contexts[N, C]`` in batches, and the mean wall time per batch (s)."""
    check_sampler(run, cfg)
    generator = torch.Generator(run.device).manual_seed(seed)
    out, times = [], []
    for start in progress_bar(range(0, contexts.shape[0], cfg.batch_size), desc="sampling", leave=False):
        began = time.perf_counter()
        tokens = generate(
            run.model, run.kernel, contexts[start : start + cfg.batch_size].to(run.device), cfg, generator, run.task
        )
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
        times.append(time.perf_counter() - began)
        out.extend(tokens.tolist())
    return out, sum(times) / max(1, len(times))


def mean_scores(rows: list[dict[str, float]]) -> dict:
    """``{n, accuracy, <other score>: mean}`` of a task's score dicts (``correct`` is reported as ``accuracy``)."""
    return {
        "n": len(rows),
        **{("accuracy" if k == "correct" else k): sum(float(r[k]) for r in rows) / len(rows) for k in rows[0]},
    }


def evaluate_examples(
    run: LoadedRun, examples: list[EvalExample], cfg: SampleConfig, seed: int = 0, show: int = 3
) -> dict:
    """Accuracy overall and per group, plus the mean of every other score (e.g. Countdown ``loose``)."""
    if not examples:
        raise DihalValueError("no evaluation examples")
    contexts = example_contexts(examples)
    targets, seconds = sample_targets(run, contexts, cfg, seed)
    scored = [(ex.group, run.task.score(ex, target)) for ex, target in zip(examples, targets)]
    groups = {
        group: mean_scores([scores for g, scores in scored if g == group])
        for group in dict.fromkeys(g for g, _ in scored)
    }
    overall = mean_scores([scores for _, scores in scored])
    return {
        **overall,
        "groups": groups,
        "sampling_steps": cfg.steps,
        "seconds_per_batch": seconds,
        "batch_size": cfg.batch_size,
        "examples": [run.task.render(t) for t in targets[:show]],
    }


def accuracy_vs_steps(
    run: LoadedRun, examples: list[EvalExample], steps_list: list[int], cfg: SampleConfig, seed: int = 0
) -> list[dict]:
    """``[{steps, accuracy, groups, seconds_per_batch}, ...]``; AR decodes once (it has no steps)."""
    rows = []
    for steps in steps_list:
        if kind_of(run.model).trace is None and rows:
            rows.append({**rows[0], "steps": steps})
            continue
        result = evaluate_examples(run, examples, replace(cfg, steps=steps), seed, show=0)
        rows.append(
            {
                "steps": steps,
                "accuracy": result["accuracy"],
                "groups": result["groups"],
                "seconds_per_batch": result["seconds_per_batch"],
            }
        )
        logger.info("%s: %d steps -> accuracy %.4f", run.config.model.kind, steps, result["accuracy"])
    return rows


def readout_by_step(run: LoadedRun, examples: list[EvalExample], cfg: SampleConfig, seed: int = 0) -> list[dict]:
    """The task's scores of the decoded answer after each sampling step (``step`` 1 = the first; HC-DLM / Latent DM:
    the token read-out ``argmax p(k0 | x_hat_0)``, the last equal to the answer at temperature 0; MDM / CCDD: the
    revealed tokens with every still-masked slot filled by its argmax). A chain that locks onto its own mistakes
    shows as accuracy falling from the first steps to the last."""
    trace = kind_of(run.model).trace
    if trace is None:
        raise DihalValueError(f"a per-step read-out needs a diffusion run (it has steps), not {run.config.model.kind}")
    check_sampler(run, cfg)
    generator = torch.Generator(run.device).manual_seed(seed)
    per_step: list[list[dict]] = [[] for _ in range(cfg.steps)]
    for start in range(0, len(examples), cfg.batch_size):
        batch = examples[start : start + cfg.batch_size]
        steps = trace(run.model, run.kernel, example_contexts(batch, run.device), cfg, generator)
        for rows, tokens in zip(per_step, steps):
            rows.extend(run.task.score(ex, target) for ex, target in zip(batch, tokens.tolist()))
    return [{"step": i + 1, **mean_scores(rows)} for i, rows in enumerate(per_step)]


def example_contexts(batch: list[EvalExample], device: torch.device | str = "cpu") -> torch.Tensor:
    """``[B, C]`` context tokens of a batch of examples."""
    return torch.tensor([ex.context for ex in batch], dtype=torch.long, device=device).reshape(len(batch), -1)


def evaluate_text(
    run: LoadedRun,
    n_samples: int,
    cfg: SampleConfig,
    evaluator_dir: str | Path,
    reference: list[str] | None = None,
    seed: int = 0,
) -> dict:
    """Gen PPL (evaluator LM, float32) and mean per-sample unigram entropy of ``n_samples`` samples;
    with ``reference`` texts, the same numbers for real data as a yardstick."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dihal_fast.common.hf_loading import load_whole
    from dihal_fast.common.metrics import mean_unigram_entropy
    from dihal_fast.evaluate.scoring import generative_perplexity

    contexts = torch.zeros(n_samples, 0, dtype=torch.long)
    targets, seconds = sample_targets(run, contexts, cfg, seed)
    texts = [run.task.render(t) for t in targets]
    evaluator = load_whole(AutoModelForCausalLM, evaluator_dir, dtype=torch.float32).eval()  # whole or refused
    tokenizer = AutoTokenizer.from_pretrained(evaluator_dir)

    def score(samples: list[str]) -> dict:
        result = generative_perplexity(samples, evaluator, tokenizer)
        ids = [t for t in result.pop("token_ids") if t]
        return {**result, "entropy": mean_unigram_entropy(ids)}

    out = {
        "n": n_samples,
        **score(texts),
        "sampling_steps": cfg.steps,
        "temperature": cfg.temperature,
        "seconds_per_batch": seconds,
        "evaluator": str(evaluator_dir),
        "examples": texts[:3],
    }
    if reference:
        data = score(reference)
        out["data_reference"] = {"gen_ppl": data["gen_ppl"], "entropy": data["entropy"], "n": len(reference)}
    return out
