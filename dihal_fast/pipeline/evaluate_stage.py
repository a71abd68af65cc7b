"""The evaluate stage: a hybrid against its backbone (and same-budget controls) with a named protocol.

``evaluate(EvaluateConfig(hybrid=...), out)`` scores both on the held-out tail of the corpus, samples from
both, optionally adds the oracle / worst layers of a sweep and the Diffusion-LM-like control, and writes
``out/evaluate.json`` (finished sections in ``out/sections`` are reused).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dihal_fast.common.assets import corpus_option, corpus_or_default
from dihal_fast.common.devices import DTYPE_CHOICES, device_map_option, device_option, dtype_option
from dihal_fast.common.options import option
from dihal_fast.common.validation import CheckedConfig
from dihal_fast.evaluate.harness import EvalProtocolConfig
from dihal_fast.pipeline.reports import EvaluateReport


@dataclass
class EvaluateConfig(CheckedConfig):
    """The hybrid, the corpus, the evaluator LM, the controls, the devices and the :class:`EvalProtocolConfig`
    (every field checked when the config is built, before any work)."""

    hybrid: str = option(
        help="`dihal replace` run directory (its result.json names the hybrid and its backbone) or hybrid directory "
        "(then with --backbone)"
    )
    corpus: list[str] | None = corpus_option()
    sweep: str | None = option(
        None, "a `dihal sweep` run: also evaluate its lowest- and highest-bridge-loss layers (oracle, worst)"
    )
    diffusion_lm_steps: int = option(
        0, "train the Diffusion-LM-like control for this many steps (0 = skip; use the hybrid's budget)"
    )
    backbone: str | None = option(
        None, "the checkpoint the hybrid was cut from (default: the model in the replace run's result.json)"
    )
    evaluator: str | None = option(None, "causal LM scoring the samples (Gen PPL); default: the hybrid's backbone")
    evaluator_dtype: str = option(
        "auto",
        "dtype of the evaluator LM (recorded in the report): auto (its checkpoint's own) or a dtype; the backbone "
        "as evaluator in the backbone's dtype is the same loaded model",
        choices=DTYPE_CHOICES,
    )
    retokenise: bool = option(
        False, "allow an evaluator whose tokenizer differs from the hybrid's (samples are decoded and retokenised)"
    )
    tasks: str | None = option(
        None,
        "comma-separated lm-evaluation-harness tasks run on the hybrid, its backbone and "
        "the controls through lm-eval's HFLM (offline: dihal_lambada_local,dihal_cloze_local; "
        "needs dihal_fast[lm_eval])",
    )
    task_limit: int | None = option(None, "only the first N examples of each task (a quick check; default: all)", min=1)
    device: str = device_option(
        help="device of every model (hybrid, backbone, controls, evaluator): auto (cuda "
        "when torch sees one, else cpu), cpu, cuda or cuda:N"
    )
    dtype: str = dtype_option(
        help="dtype of the hybrid's retained layers, its backbone and the controls: auto (each checkpoint's own), "
        "float32, bfloat16, float16 or float64; a bridge follows it (--bridge-dtype; the evaluator: --evaluator-dtype)"
    )
    device_map: str = device_map_option()
    settings: EvalProtocolConfig = field(
        default_factory=EvalProtocolConfig, metadata={"help": "what is measured and how much"}
    )


def evaluate(config: EvaluateConfig, out: str | Path) -> EvaluateReport:
    """The evaluation in run directory ``out`` (holding its lock), after seeding the global RNGs with
    ``settings.seed``, so that the numbers do not depend on what ran before in the same process (e.g. ``dihal
    demo`` resuming a run). A hybrid is scored and sampled with its deterministic bridge noise (the fixed
    per-position draw of its config's ``noise_seed``; see :class:`dihal_fast.hybrid.HybridConfig`)."""
    from dihal_fast.common import resolve_device, seed_everything
    from dihal_fast.common.hf_loading import placement
    from dihal_fast.common.rundir import run_directory
    from dihal_fast.evaluate.models import Placement, resolve_models, sweep_controls
    from dihal_fast.evaluate.run import evaluate_hybrid

    tasks = None
    if config.tasks is not None:  # refused before any model loads: no harness, an unknown task, a bad limit
        from dihal_fast.evaluate.downstream import check_tasks

        tasks, _ = check_tasks(config.tasks)
    # A strategy with a pinned GPU, without accelerate or with no ranks-per-node under a launcher: refused now.
    placement(resolve_device(config.device), config.device_map)
    controls = sweep_controls(config.sweep) if config.sweep else None
    seed_everything(config.settings.seed)
    with run_directory(out, "dihal evaluate"):
        models = resolve_models(
            config.hybrid,
            config.backbone,
            config.evaluator,
            config.evaluator_dtype,
            Placement(config.device, config.dtype, config.device_map),
            controls,
            seq_len=config.settings.seq_len,
        )
        report = evaluate_hybrid(
            models,
            corpus_or_default(config.corpus),
            out,
            config.settings,
            retokenise=config.retokenise,
            diffusion_lm_steps=config.diffusion_lm_steps,
            tasks=tasks,
            task_limit=config.task_limit,
        )
    return EvaluateReport(Path(out), report)
