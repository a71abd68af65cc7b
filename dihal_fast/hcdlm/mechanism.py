"""Mechanism diagnostics of a trained run: does the hierarchy carry the solution?

- :func:`in_sampler_interventions`: the sampler run with one part of its carried state replaced at every step
  (the latent by the prior, by another puzzle's, by one re-encoded from the current tokens; the scaffold by the
  prior; :data:`~dihal_fast.hcdlm.sampler.INTERVENTIONS`), each chain's accuracy beside the normal chain's, same
  seed. The latent carries information beyond the tokens exactly by the gap between the normal chain and the
  re-encoded one, reported with its paired bootstrap interval over the puzzles.
- :func:`readout_trajectory`: the decoded answer after every sampling step, at normalised step
  ``step / steps`` (HC-DLM / Latent DM: ``argmax p(k0 | x_hat_0)``; MDM: the revealed tokens with every
  still-masked slot filled by its argmax), so HC-DLM and MDM share one axis (the paper's Fig. 3a). It rises for
  any iterative refiner, so it says nothing about the latent.
- :func:`ablation_readout`, an *oracle* probe (it is given the true answer): the one-step read-out
  ``argmax p(k0 | d(x_t, k_t, s))`` at fixed noise levels from correctly noised inputs (``x_0`` = the encoder mean
  of the true tokens, noised to the latent's level at ``s``, ``HCDLMModelConfig.latent_schedule_power``), and with
  one input replaced: ``x_t`` by pure noise, the scaffold by the true tokens, or by random tokens. A read-out that
  does not move when ``x_t`` is noise ignores the latent; one that does not move between a true and a random
  scaffold ignores the scaffold. Its ``x_t`` is the true answer's code, which the sampler never has: it shows what
  the denoiser can read, not what the chain carries.
"""

from __future__ import annotations

import torch

from dihal_fast.errors import DihalValueError
from dihal_fast.hcdlm.config import SampleConfig
from dihal_fast.hcdlm.models import kind_of
from dihal_fast.hcdlm.noise import LATENT_FLOW, latent_level, scaffold_level
from dihal_fast.hcdlm.sampler import INTERVENTIONS, sample_hcdlm
from dihal_fast.hcdlm.scoring import LoadedRun, example_contexts, mean_scores, readout_by_step
from dihal_fast.hcdlm.stats import paired_bootstrap
from dihal_fast.tasks.base import EvalExample

ABLATION_LEVELS = (0.05, 0.25, 0.5, 0.75, 0.95)
# read-out variants: the model's inputs, then each with one input replaced
ABLATIONS = ("model", "x_t_noise", "scaffold_true", "scaffold_random")


def reference_targets(run: LoadedRun, batch: list[EvalExample]) -> torch.Tensor:
    """The true target tokens of Sudoku examples ``[B, L]`` (Countdown and text have no single reference)."""
    if run.config.task.name != "sudoku":
        raise DihalValueError(
            f"the scaffold ablations need a reference answer per example: Sudoku runs only, not {run.config.task.name}"
        )
    return torch.tensor([run.task.encode(*ex.payload)[1] for ex in batch], dtype=torch.long, device=run.device)


def _batches(count: int, size: int) -> list[range]:
    """Ranges of at most ``size`` (a last range of one joins the one before: another puzzle's latent needs two)."""
    starts = list(range(0, count, size))
    if len(starts) > 1 and count - starts[-1] == 1:
        starts.pop()
    return [range(start, stop) for start, stop in zip(starts, starts[1:] + [count])]


@torch.no_grad()
def in_sampler_interventions(
    run: LoadedRun,
    examples: list[EvalExample],
    cfg: SampleConfig,
    seed: int = 0,
    interventions: tuple[str, ...] = INTERVENTIONS,
) -> dict:
    """HC-DLM / Latent DM: ``{variants: {normal | <intervention>: scores}, correct: {variant: per puzzle},
    normal_minus: {intervention: interval}, latent_beyond_tokens: interval}`` - one chain per puzzle (``cfg``
    without best-of), every variant from the same seed; ``normal_minus`` is the paired bootstrap of the normal
    chain's minus each intervention's per-puzzle ``correct``, ``latent_beyond_tokens`` its ``latent_reencoded``
    entry. ``interventions``: which to run (``latent_reencoded`` among them)."""
    if "latent_reencoded" not in interventions:
        raise DihalValueError(f"the interventions must include latent_reencoded, got {interventions}")
    if not kind_of(run.model).latent:
        raise DihalValueError(
            f"the in-sampler interventions probe a latent model (HC-DLM, Latent DM), not {run.config.model.kind}"
        )
    if len(examples) < 2:
        raise DihalValueError("the in-sampler interventions need at least 2 examples (another puzzle's latent)")
    names = [None, *(i for i in interventions if run.model.scaffold or i != "scaffold_prior")]
    scored: dict[str, list[dict]] = {}
    for intervention in names:
        generator = torch.Generator(run.device).manual_seed(seed)
        rows: list[dict] = []
        for part in _batches(len(examples), cfg.batch_size):
            batch = [examples[i] for i in part]
            tokens = sample_hcdlm(
                run.model, run.kernel, example_contexts(batch, run.device), cfg, generator, intervention=intervention
            )
            rows.extend(run.task.score(ex, target) for ex, target in zip(batch, tokens.tolist()))
        scored[intervention or "normal"] = rows
    correct = {name: [float(r["correct"]) for r in rows] for name, rows in scored.items()}
    gaps = {
        name: paired_bootstrap(correct["normal"], hits, seed=seed) for name, hits in correct.items() if name != "normal"
    }
    return {
        "variants": {name: mean_scores(rows) for name, rows in scored.items()},
        "correct": correct,
        "normal_minus": gaps,
        "latent_beyond_tokens": gaps["latent_reencoded"],
        "steps": cfg.steps,
    }


def readout_trajectory(
    run: LoadedRun, examples: list[EvalExample], cfg: SampleConfig, seed: int = 0, rows: list[dict] | None = None
) -> list[dict]:
    """The decoded answer's scores after each sampling step, with ``fraction`` = step / steps (every kind with
    steps); ``rows``: the run's :func:`readout_by_step` already traced with these settings."""
    if rows is None:
        rows = readout_by_step(run, examples, cfg, seed)
    return [{**row, "fraction": row["step"] / cfg.steps} for row in rows]


def check_levels(levels: tuple[float, ...]) -> None:
    """Ablation noise levels must lie in (0, 1]."""
    for s in levels:
        if not 0.0 < s <= 1.0:
            raise DihalValueError(f"ablation noise levels must be in (0, 1], got {s}")


@torch.no_grad()
def ablation_readout(
    run: LoadedRun,
    examples: list[EvalExample],
    levels: tuple[float, ...] = ABLATION_LEVELS,
    seed: int = 0,
    batch_size: int = 256,
) -> list[dict]:
    """``[{s, model: scores, x_t_noise: scores, scaffold_true: ..., scaffold_random: ...}]`` per level ``s``
    (Latent DM: the first two only). Scores are the task's means (Sudoku: accuracy, valid, blank_cells)."""
    model = run.model
    if not kind_of(model).latent:
        raise DihalValueError(f"the ablations probe a latent model (HC-DLM, Latent DM), not {run.config.model.kind}")
    check_levels(levels)
    variants = ABLATIONS if model.scaffold else ABLATIONS[:2]
    generator = torch.Generator(run.device).manual_seed(seed)
    rows = []
    for s in levels:
        scored: dict[str, list[dict]] = {name: [] for name in variants}
        for start in range(0, len(examples), batch_size):
            batch = examples[start : start + batch_size]
            context, truth = example_contexts(batch, run.device), reference_targets(run, batch)
            level = torch.full((len(batch),), float(s), device=run.device)
            x_0 = model.encoder(truth, context)[0]
            eps = torch.randn(x_0.shape, generator=generator, device=run.device)
            x_t = LATENT_FLOW.noise(x_0, latent_level(level, model.cfg.latent_schedule_power), eps)
            scaffold_at = scaffold_level(level, model.cfg.scaffold_floor)
            scaffold = run.kernel.corrupt(truth, scaffold_at, generator) if model.scaffold else None
            inputs = {"model": (x_t, scaffold), "x_t_noise": (eps, scaffold)}
            if model.scaffold:
                inputs["scaffold_true"] = (x_t, truth)
                inputs["scaffold_random"] = (x_t, run.kernel.random_tokens(tuple(truth.shape), generator, run.device))
            for name, (x, k) in inputs.items():
                tokens = model.predictor(model.denoiser(x, k, level, context), context).argmax(-1).tolist()
                scored[name].extend(run.task.score(ex, target) for ex, target in zip(batch, tokens))
        rows.append({"s": s, **{name: mean_scores(rows_) for name, rows_ in scored.items()}})
    return rows


def ablation_effects(rows: list[dict], key: str) -> dict[str, float]:
    """Per ablation, the signed change of ``key`` from the model's read-out at the level where it is largest;
    with a scaffold also ``true_minus_random_scaffold``, the largest gap between the two scaffold ablations."""

    def largest(deltas: list[float]) -> float:
        return max(deltas, key=abs)

    effects = {
        name: largest([row[name][key] - row["model"][key] for row in rows]) for name in ABLATIONS[1:] if name in rows[0]
    }
    if "scaffold_true" in rows[0]:
        effects["true_minus_random_scaffold"] = largest(
            [row["scaffold_true"][key] - row["scaffold_random"][key] for row in rows]
        )
    return effects
