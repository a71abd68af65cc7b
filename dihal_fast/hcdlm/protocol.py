"""One evaluation protocol for every model kind: a single chain, best-of-K and oracle@K side by side, each row with
the sampling cost it took, and the settings each kind is scored with chosen on a validation set first.

- *single chain*: one chain per puzzle at argmax (MDM / CCDD on Sudoku with the givens in place), the step count
  chosen on validation among ``steps_choices``;
- *best-of-K*: K chains per puzzle from the kind's own diversity source (:data:`DIVERSITY`: temperature, reveal-order
  noise) and the answer the verifier (``SampleConfig.verifier``, the same for every kind: the chain's own
  log-probability, or the task's rules of :mod:`dihal_fast.hcdlm.rules`) scores highest; source and verifier chosen
  on validation (``dihal hcdlm eval --best-of K`` takes the kind's default source, :func:`best_of_config`);
- *oracle@K*: the same K chains, counted correct when any one is (an upper bound on any verifier's pick; its cost
  is the chains' without the verifier).

Cost per row, per puzzle: ``passes`` (rows through the kind's main network), ``block_passes`` (rows through every
transformer block; a verifier's would count too, and neither ``chain`` nor ``rules`` makes any) and
``width64_block_passes`` (those at width 64, for kinds of other widths), measured by
:class:`~dihal_fast.hcdlm.models.PassCounter`, so rows of different kinds compare at stated, not assumed, cost.
Every row also states the run's ``parameters`` and ``sampling_parameters`` (those a chain reads,
:func:`~dihal_fast.hcdlm.models.sampling_parameters`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, MutableMapping
from dataclasses import replace

import torch
from torch import nn

from dihal_fast.errors import DihalValueError
from dihal_fast.hcdlm.config import VERIFIERS, SampleConfig
from dihal_fast.hcdlm.layers import count_parameters
from dihal_fast.hcdlm.models import (
    COSTS,
    REVEALING,
    PassCounter,
    check_sample,
    choose,
    kind_of,
    sample_chains,
    sampling_parameters,
    verify_chains,
)
from dihal_fast.hcdlm.scoring import LoadedRun, example_contexts, mean_scores
from dihal_fast.hcdlm.stats import paired_bootstrap
from dihal_fast.tasks.base import EvalExample

logger = logging.getLogger(__name__)

# Each kind's candidate diversity sources for best-of-K (SampleConfig fields), its default first. HC-DLM's and Latent
# DM's chains differ at argmax already (x_T, the scaffold's re-noising), CCDD's too (z_1); MDM and AR need noise to
# differ at all.
_LATENT = ({"temperature": 0.0}, {"temperature": 0.5}, {"temperature": 1.0})
DIVERSITY: dict[str, tuple[dict, ...]] = {
    "hcdlm": _LATENT,
    "latent": _LATENT,
    "mdm": ({"reveal_noise": 0.1}, {"reveal_noise": 0.3}, {"temperature": 0.5}, {"temperature": 1.0}),
    "ccdd": ({"temperature": 0.0}, {"reveal_noise": 0.1}, {"temperature": 1.0}),
    "ar": ({"temperature": 0.5}, {"temperature": 1.0}),
}


def diverse_candidates(model: nn.Module, sample: SampleConfig, k: int) -> list[SampleConfig]:
    """``sample`` as ``k`` chains from each diversity source of the model's kind (:data:`DIVERSITY`), the kind's default
    first: the candidates the protocol chooses among on validation, and the default :func:`best_of_config` takes."""
    return [replace(sample, best_of=k, **source) for source in DIVERSITY[kind_of(model).name]]


def best_of_config(model: nn.Module, sample: SampleConfig, k: int) -> SampleConfig:
    """``sample`` as ``k`` chains: from its own diversity source when it has one (temperature or reveal noise > 0),
    else from the kind's default (the first of :func:`diverse_candidates`; e.g. MDM's reveal-order noise, where its
    argmax chains would all be one); ``k`` 1: ``sample`` as one chain, unchanged otherwise."""
    if k == 1 or sample.temperature or sample.reveal_noise:
        return replace(sample, best_of=k)
    return diverse_candidates(model, sample, k)[0]


def single_chain(run: LoadedRun, sample: SampleConfig, steps: int) -> SampleConfig:
    """The single-chain settings: argmax, no reveal noise, one chain; givens in place for revealing kinds on Sudoku."""
    givens = kind_of(run.model).name in REVEALING and run.config.task.name == "sudoku"
    return replace(sample, steps=steps, temperature=0.0, reveal_noise=0.0, best_of=1, givens=givens)


def _chains(
    run: LoadedRun, examples: list[EvalExample], cfg: SampleConfig, seed: int, verifiers: tuple[str, ...] = ()
) -> tuple[list[list[list[int]]], dict[str, list[list[int]]], dict]:
    """``(chains per example [K][L], chosen per example by each verifier, cost per example)`` of ``cfg`` (K =
    ``cfg.best_of``); ``verifiers`` (default: ``cfg.verifier``) all choose from the same chains. The draws do not
    depend on the verifier (the chain's own log-probability is bookkeeping on logits the sampler has, no draw, no
    pass), so every verifier gets exactly the chains a run with it alone would sample, at one sampling's cost.
    ``cost``: ``chain``, the chains' cost per example (by :data:`~dihal_fast.hcdlm.models.COSTS`), and ``verifier``,
    each verifier's (:func:`_with_verifier` adds them)."""
    verifiers = verifiers or (cfg.verifier,)
    check_sample(run.model, cfg)
    sampling = replace(cfg, verifier="chain" if "chain" in verifiers else cfg.verifier)
    k, generator = cfg.best_of, torch.Generator(run.device).manual_seed(seed)
    chains: list[list[list[int]]] = []
    chosen: dict[str, list[list[int]]] = {verifier: [] for verifier in verifiers}
    spent = {verifier: dict.fromkeys(COSTS, 0.0) for verifier in verifiers}
    with PassCounter(run.model) as total:
        for start in range(0, len(examples), cfg.batch_size):
            rows = example_contexts(examples[start : start + cfg.batch_size], run.device).repeat_interleave(k, dim=0)
            tokens, chain_scores = sample_chains(run.model, run.kernel, rows, sampling, generator)
            for verifier in verifiers:
                picked = tokens
                if k > 1:
                    with PassCounter(run.model) as verifying:
                        scores = verify_chains(rows, tokens, chain_scores, replace(cfg, verifier=verifier), run.task)
                    for name, value in verifying.figures().items():
                        spent[verifier][name] += value
                    picked = choose(tokens, scores, k)
                chosen[verifier].extend(picked.tolist())
            chains.extend(tokens.view(-1, k, tokens.shape[-1]).tolist())
    n, totals = len(examples), total.figures()
    cost = {
        "chain": {name: (totals[name] - sum(used[name] for used in spent.values())) / n for name in COSTS},
        "verifier": {verifier: {name: value / n for name, value in used.items()} for verifier, used in spent.items()},
    }
    return chains, chosen, cost


def _with_verifier(cost: dict, verifier: str) -> dict[str, float]:
    """The cost per example of K chains and ``verifier``'s pick among them (``cost`` from :func:`_chains`)."""
    return {name: cost["chain"][name] + cost["verifier"][verifier][name] for name in COSTS}


def _row(run: LoadedRun, examples: list[EvalExample], answers: list[list[int]], **fields) -> tuple[dict, list[float]]:
    """The row of ``answers`` (the run's parameter counts, mean scores, per group) and its per-example ``correct``
    (1.0 / 0.0, in order)."""
    scored = [run.task.score(ex, answer) for ex, answer in zip(examples, answers)]
    groups = {
        g: mean_scores([s for ex, s in zip(examples, scored) if ex.group == g])
        for g in dict.fromkeys(ex.group for ex in examples)
    }
    counts = {"parameters": count_parameters(run.model), "sampling_parameters": sampling_parameters(run.model)}
    return {**fields, **counts, **mean_scores(scored), "groups": groups}, [float(s["correct"]) for s in scored]


def _oracle(run: LoadedRun, examples: list[EvalExample], chains: list[list[list[int]]]) -> list[list[int]]:
    """Per example, a correct chain if any is (else the first): oracle@K's answers."""
    return [
        next((c for c in options if run.task.score(ex, c)["correct"]), options[0])
        for ex, options in zip(examples, chains)
    ]


def single_chain_row(run: LoadedRun, examples: list[EvalExample], single: SampleConfig, seed: int = 0) -> dict:
    """The ``single`` row on ``examples``: mean scores, per group, its ``settings``, cost per puzzle and ``correct``
    per example (in order)."""
    _, answers, cost = _chains(run, examples, single, seed)
    row, correct = _row(run, examples, answers[single.verifier], mode="single", k=1, **cost["chain"])
    return {**row, "settings": _settings(single), "correct": correct}


def protocol_rows(
    run: LoadedRun, examples: list[EvalExample], single: SampleConfig, diverse: SampleConfig, seed: int = 0
) -> list[dict]:
    """The three rows (``single``, ``best_of``, ``oracle``) on ``examples``, each with its ``settings``, cost per
    puzzle and ``correct`` per example (in order: rows of other runs on the same examples pair with it); ``best_of``
    also carries the paired bootstrap of its per-puzzle ``correct`` minus the single chain's."""
    single_row = single_chain_row(run, examples, single, seed)
    single_correct = single_row["correct"]
    chains, chosen, cost = _chains(run, examples, diverse, seed)
    best_row, best_correct = _row(
        run,
        examples,
        chosen[diverse.verifier],
        mode="best_of",
        k=diverse.best_of,
        **_with_verifier(cost, diverse.verifier),
    )
    best_row.update(settings=_settings(diverse), correct=best_correct)
    best_row["minus_single"] = paired_bootstrap(best_correct, single_correct, seed=seed)
    oracle_row, oracle_correct = _row(
        run, examples, _oracle(run, examples, chains), mode="oracle", k=diverse.best_of, **cost["chain"]
    )
    oracle_row.update(settings=_settings(diverse), correct=oracle_correct)
    return [single_row, best_row, oracle_row]


def _settings(cfg: SampleConfig) -> dict:
    return {
        name: getattr(cfg, name) for name in ("steps", "temperature", "reveal_noise", "givens", "verifier", "best_of")
    }


def _candidate(
    memo: MutableMapping[str, list[dict]] | None, cfg: SampleConfig, score: Callable[[], list[dict]]
) -> list[dict]:
    """One validation candidate's rows: ``score()``, or what ``memo`` kept for the same settings (each candidate draws
    from its own fresh generator, so a kept row equals a rescored one)."""
    if memo is None:
        return score()
    key = json.dumps(_settings(cfg), sort_keys=True)
    if key not in memo:
        memo[key] = score()
    return memo[key]


def choose_on_validation(
    run: LoadedRun,
    validation: list[EvalExample],
    sample: SampleConfig,
    k: int,
    steps_choices: tuple[int, ...],
    seed: int = 0,
    memo: MutableMapping[str, list[dict]] | None = None,
) -> tuple[SampleConfig, SampleConfig, list[dict]]:
    """``(single, diverse, table)``: the single chain's step count (the most accurate on ``validation``, ties: the
    fewest), then at that count the diversity source x verifier whose best-of-``k`` is the most accurate (ties: the
    first of :data:`DIVERSITY` / :data:`~dihal_fast.hcdlm.config.VERIFIERS`); ``table`` has every candidate's row.
    ``memo`` (e.g. a file-backed mapping) keeps each candidate's rows as it is scored, so a killed choice resumes
    at the candidate it was scoring."""
    kind = kind_of(run.model)
    table: list[dict] = []
    steps_list = (sample.steps,) if kind.trace is None else tuple(steps_choices or (sample.steps,))
    best_single: tuple[float, SampleConfig] | None = None
    for steps in steps_list:
        cfg = single_chain(run, sample, steps)

        def score_single(cfg: SampleConfig = cfg) -> list[dict]:
            _, answers, cost = _chains(run, validation, cfg, seed)
            row, _ = _row(run, validation, answers[cfg.verifier], mode="single", k=1, **cost["chain"])
            return [{**row, "settings": _settings(cfg)}]

        (row,) = _candidate(memo, cfg, score_single)
        table.append(row)
        if best_single is None or row["accuracy"] > best_single[0]:
            best_single = (row["accuracy"], cfg)
    assert best_single is not None
    single = best_single[1]
    best_diverse: tuple[float, SampleConfig] | None = None
    for cfg in diverse_candidates(run.model, single, k):  # one set of chains per source, chosen from by every verifier

        def score_source(cfg: SampleConfig = cfg) -> list[dict]:
            _, chosen, cost = _chains(run, validation, cfg, seed, VERIFIERS)
            rows = []
            for verifier in VERIFIERS:
                row, _ = _row(run, validation, chosen[verifier], mode="best_of", k=k, **_with_verifier(cost, verifier))
                rows.append({**row, "settings": _settings(replace(cfg, verifier=verifier))})
            return rows

        for verifier, row in zip(VERIFIERS, _candidate(memo, cfg, score_source), strict=True):
            table.append(row)
            if best_diverse is None or row["accuracy"] > best_diverse[0]:
                best_diverse = (row["accuracy"], replace(cfg, verifier=verifier))
    assert best_diverse is not None
    logger.info("chosen on validation: single %s, best-of %s", _settings(single), _settings(best_diverse[1]))
    return single, best_diverse[1], table


def protocol_choice(
    run: LoadedRun,
    validation: list[EvalExample],
    sample: SampleConfig,
    k: int,
    steps_choices: tuple[int, ...] = (),
    seed: int = 0,
    memo: MutableMapping[str, list[dict]] | None = None,
) -> dict:
    """``{chosen: {single, best_of}, validation: table, validation_n}``: the settings :func:`choose_on_validation`
    picks (``memo``: its), as a JSON-ready dict that depends on ``validation`` only (so any test file can be scored
    with it)."""
    if k < 2:
        raise DihalValueError(f"the protocol compares best-of-K with one chain: K must be >= 2, got {k}")
    single, diverse, table = choose_on_validation(run, validation, sample, k, steps_choices, seed, memo)
    return {
        "chosen": {"single": _settings(single), "best_of": _settings(diverse)},
        "validation": table,
        "validation_n": len(validation),
    }


def chosen_configs(chosen: dict, sample: SampleConfig | None = None) -> tuple[SampleConfig, SampleConfig]:
    """The ``(single, best_of)`` sampler configs of a choice's ``chosen`` settings, over ``sample``'s other fields
    (the defaults when None)."""
    base = sample or SampleConfig()
    return replace(base, **chosen["single"]), replace(base, **chosen["best_of"])
