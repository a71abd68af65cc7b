"""Downstream tasks through lm-evaluation-harness: its own ``HFLM`` around an already-loaded model.

The shipped offline tasks (``dihal_lambada_local``, ``dihal_cloze_local``; built by
:mod:`dihal_fast.evaluate.task_data`) are lm-eval task configs in :data:`TASKS_DIR`, so the harness's
command line runs them too::

    lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True \\
        --tasks dihal_lambada_local,dihal_cloze_local --include_path "$(python -m dihal_fast.evaluate.downstream)"

:func:`run_tasks` scores one model the same way from Python (``lm_eval.simple_evaluate`` on an ``HFLM``
wrapping the model object), and :func:`downstream_report` every model of ``dihal evaluate --tasks``.
lm-eval is the optional extra ``dihal_fast[lm_eval]``; without it these functions raise an ImportError
naming it before any work starts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from dihal_fast.common.assets import ASSETS_DIR
from dihal_fast.corpus import token_convention
from dihal_fast.errors import DihalError, DihalValueError

logger = logging.getLogger(__name__)

TASKS_DIR = ASSETS_DIR / "tasks"
LOCAL_TASKS = ("dihal_lambada_local", "dihal_cloze_local")
INSTALL_HINT = "pip install 'dihal_fast[lm_eval]'"
PROTOCOL = (
    "lm-evaluation-harness simple_evaluate, zero-shot, no chat template, on lm_eval.models.huggingface.HFLM "
    "wrapping the loaded model and its tokenizer (contexts start with the BOS where the tokenizer adds one, and "
    "an empty context is the start-of-document token); acc of a loglikelihood task = the greedy "
    "continuation is exactly the target's tokens, perplexity = exp(-mean target log-likelihood); "
    "multiple choice: acc = highest log-likelihood, acc_norm = highest per byte, acc_mutual_info = highest "
    "log p(choice | context) - log p(choice); *_stderr = the harness's standard error of the mean (bootstrap "
    "for perplexity)"
)


class MissingHarness(DihalError, ImportError):
    """lm-evaluation-harness (or the accelerate its HF backend imports) is not installed."""


def require_lm_eval():
    """The ``lm_eval`` module with its HF backend, or :class:`MissingHarness` saying which extra to install."""
    try:
        import lm_eval
        import lm_eval.models.huggingface  # needs accelerate: part of the extra
    except ImportError as exc:
        raise MissingHarness(
            f"downstream tasks need lm-evaluation-harness with its HF backend ({exc}); {INSTALL_HINT}"
        ) from None
    return lm_eval


def parse_tasks(tasks: str | Sequence[str] | None) -> list[str]:
    """``"a,b"`` or ``["a", "b"]`` -> ``["a", "b"]`` (order kept, duplicates and blanks dropped)."""
    if tasks is None:
        return []
    parts = tasks.split(",") if isinstance(tasks, str) else [p for item in tasks for p in str(item).split(",")]
    names = [p.strip() for p in parts if p.strip()]
    return list(dict.fromkeys(names))


def task_manager(tasks: Sequence[str]):
    """An lm-eval ``TaskManager`` that knows the shipped tasks; lm-eval's own ~15k task configs are indexed
    (about 15 CPU-seconds) only when a requested task is not one of :data:`LOCAL_TASKS`."""
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS_DIR), include_defaults=not set(tasks) <= set(LOCAL_TASKS))


def check_tasks(tasks: str | Sequence[str] | None):
    """The parsed task names and a ``TaskManager`` holding them; a ValueError naming the unknown ones."""
    names = parse_tasks(tasks)
    if not names:
        raise DihalValueError(f"--tasks names no task (got {tasks!r}); the shipped ones are {','.join(LOCAL_TASKS)}")
    manager = task_manager(names)
    unknown = [name for name in names if name not in manager.all_tasks]
    if unknown:
        raise DihalValueError(
            f"unknown lm-eval task(s) {', '.join(unknown)}; the shipped offline tasks are "
            f"{', '.join(LOCAL_TASKS)}, and `lm_eval ls tasks` lists the harness's own"
        )
    return names, manager


def harness_lm(model, tokenizer, batch_size: int = 8):
    """lm-eval's ``HFLM`` around a loaded ``PreTrainedModel`` (it keeps the model's device and dtype), adding the
    BOS and starting an empty context as :func:`~dihal_fast.corpus.token_convention` says."""
    require_lm_eval()
    from lm_eval.models.huggingface import HFLM

    convention = token_convention(tokenizer)
    return HFLM(
        pretrained=model,
        tokenizer=tokenizer,
        batch_size=batch_size,
        add_bos_token=bool(convention.prefix),
        prefix_token_id=convention.start[-1] if convention.start else None,
    )


def _metrics(task_results: Mapping[str, Any]) -> dict:
    """``{"acc,none": x, "acc_stderr,none": s, ...}`` -> ``{"acc": x, "acc_stderr": s, ...}`` (numbers only)."""
    out = {}
    for key, value in task_results.items():
        metric, _, filter_name = key.partition(",")
        if filter_name == "none" and isinstance(value, (int, float)):
            out[metric] = float(value)
    return out


def run_tasks(
    model,
    tokenizer,
    tasks: str | Sequence[str],
    batch_size: int = 8,
    limit: int | None = None,
    seed: int = 0,
    manager=None,
    lm=None,
    per_example: bool = False,
) -> dict:
    """Score ``model`` on ``tasks`` with ``lm_eval.simple_evaluate``: ``{task: {metric: value, metric_stderr:
    value, "n": examples, "version": task version}}``. ``limit`` keeps the first N examples of each task
    (for tests); ``lm`` reuses an ``HFLM`` already built by :func:`harness_lm` for this model;
    ``per_example`` adds ``"per_example": {metric: [value per example, in task order]}`` (the loglikelihood
    tasks' per-example perplexity entry is the target's log-likelihood, named ``loglikelihood``), for paired
    comparisons of two models on the same examples."""
    lm_eval = require_lm_eval()
    names, manager = check_tasks(tasks) if manager is None else (parse_tasks(tasks), manager)
    if limit is not None and limit < 1:
        raise DihalValueError(f"limit must be >= 1 example per task, got {limit}")
    lm = harness_lm(model, tokenizer, batch_size) if lm is None else lm
    with _bootstrap_in_this_process():
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=names,
            task_manager=manager,
            limit=limit,
            num_fewshot=0,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
            bootstrap_iters=1000,
            log_samples=per_example,
        )
    out = {
        name: {
            **_metrics(results["results"][name]),
            "n": int(results["n-samples"][name]["effective"]),
            "version": results["versions"].get(name),
        }
        for name in names
    }
    if per_example:
        for name in names:
            rows = sorted(results["samples"][name], key=lambda row: row["doc_id"])
            out[name]["per_example"] = {
                _PER_EXAMPLE.get(metric, metric): [float(row[metric]) for row in rows] for metric in rows[0]["metrics"]
            }
    return out


@contextmanager
def _bootstrap_in_this_process() -> Iterator[None]:
    """lm-eval's bootstrap standard errors fork a ``multiprocessing.Pool`` (the fork start method) from this
    process, whose torch and tokenizers threads may hold locks at the fork: a worker then waits forever.
    lm-eval's own switch ``DISABLE_MULTIPROC`` makes the same draws (``random.Random(i)`` per chunk) here."""
    before = os.environ.get("DISABLE_MULTIPROC")
    os.environ["DISABLE_MULTIPROC"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DISABLE_MULTIPROC", None)
        else:
            os.environ["DISABLE_MULTIPROC"] = before


_PER_EXAMPLE = {"perplexity": "loglikelihood"}  # what lm-eval keeps per example under an aggregate's name


def downstream_report(
    models: Mapping[str, tuple[Any, Any]],
    tasks: str | Sequence[str],
    store=None,
    batch_size: int = 8,
    limit: int | None = None,
    seed: int = 0,
) -> dict:
    """Every model of ``models`` (name -> (model, tokenizer)) on every task, through the same harness calls.

    ``store`` (a :class:`~dihal_fast.evaluate.run.SectionStore`) keeps each finished model's results as the
    section ``downstream_<name>`` and reuses them when the tasks and limit are the same.
    """
    lm_eval = require_lm_eval()
    names, manager = check_tasks(tasks)
    request = {"tasks": names, "limit": limit}
    results = {}
    for name, (model, tokenizer) in models.items():
        found = store.get(f"downstream_{name}") if store is not None else None
        if found is not None and found[0].get("request") == request:
            results[name] = found[0]["results"]
            continue
        logger.info("downstream tasks %s on the %s", ",".join(names), name)
        results[name] = run_tasks(model, tokenizer, names, batch_size, limit, seed, manager)
        if store is not None:
            store.put(f"downstream_{name}", {"request": request, "results": results[name]}, [])
    return {"protocol": PROTOCOL, "lm_eval_version": lm_eval.__version__, **request, "results": results}


if __name__ == "__main__":  # `python -m dihal_fast.evaluate.downstream` prints the --include_path for lm_eval
    print(TASKS_DIR)
