"""The end-to-end main job: locate -> replace -> evaluate -> generate, then ``report.md`` / ``report.json``.

``demo(DemoConfig(), out)`` runs every stage in its own folder of run directory ``out``; a stage whose output
is there is skipped, so an interrupted demo continues where it stopped (bridge training resumes from its
checkpoint)."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dihal_fast.common import atomic_write_json, read_json
from dihal_fast.common.assets import backbone_option, corpus_option, corpus_or_default
from dihal_fast.common.devices import DEVICE_HELP, device_option, dtype_option
from dihal_fast.common.options import option
from dihal_fast.common.validation import CheckedConfig
from dihal_fast.cpu_threads import poll_threads
from dihal_fast.errors import DihalValueError
from dihal_fast.evaluate import markdown as md
from dihal_fast.evaluate.harness import EvalProtocolConfig
from dihal_fast.pipeline.evaluate_stage import EvaluateConfig
from dihal_fast.pipeline.evaluate_stage import evaluate as evaluate_stage
from dihal_fast.pipeline.generate_stage import GenerateConfig, generate
from dihal_fast.pipeline.locate_stage import LocateConfig
from dihal_fast.pipeline.reports import DemoReport
from dihal_fast.pipeline.reuse import (
    OVERWRITE_HELP,
    RESUME_HELP,
    RESUME_HINT,
    check_inputs,
    ensure_locate,
    ensure_replace,
)

logger = logging.getLogger(__name__)

PROMPTS = ("It was a bright cold day in April, and", "The President said that", "Once upon a time")


@dataclass
class DemoBudgetConfig(CheckedConfig):
    """Sizes of the demo, chosen to finish in about 15 minutes on 2 CPU cores with the shipped backbone."""

    locate_max_tokens: int = option(16384, "tokens locate reads", min=1)
    locate_repeats: int = option(5, "repeated subsamples for the proxies", min=1)
    locate_sample: int = option(1000, "tokens per subsample", min=1)
    seq_len: int = option(128, "tokens per block (locate, training, evaluation)", min=2)
    train_steps: int = option(200, "bridge training steps (the Diffusion-LM control gets the same budget)", min=1)
    batch_size: int = option(8, "blocks per bridge training step", min=1)
    val_blocks: int = option(32, "corpus-tail blocks held out from bridge training (validation)", min=1)
    diffusion_lm: bool = option(True, "train and evaluate the Diffusion-LM-like control")
    n_samples: int = option(16, "samples per model for the sample metrics", min=1)
    max_new_tokens: int = option(64, "tokens per sample", min=1)
    eval_blocks: int = option(
        32, "corpus-tail blocks for NLL/PPL/KL (at most --val-blocks, so never trained on)", min=1
    )
    seed: int = option(0, "random seed")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eval_blocks > self.val_blocks:
            raise DihalValueError(
                f"the evaluation blocks must lie in the tail the bridge never trains on: need eval-blocks <= "
                f"val-blocks ({self.eval_blocks} vs {self.val_blocks})"
            )

    @property
    def evaluation(self) -> EvalProtocolConfig:
        """The evaluation settings: this demo's block length, held-out blocks, samples and seed."""
        return EvalProtocolConfig(
            seq_len=self.seq_len,
            eval_blocks=self.eval_blocks,
            n_samples=self.n_samples,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
        )

    def locate_config(self, model: str | None, corpus: list[str]) -> LocateConfig:
        return LocateConfig(
            model=model,
            corpus=corpus,
            max_tokens=self.locate_max_tokens,
            repeats=self.locate_repeats,
            sample_size=self.locate_sample,
            seq_len=self.seq_len,
            seed=self.seed,
        )

    def train_config(self):
        from dihal_fast.replace.config import BridgeTrainConfig

        return BridgeTrainConfig(
            steps=self.train_steps,
            seq_len=self.seq_len,
            batch_size=self.batch_size,
            val_blocks=self.val_blocks,
            seed=self.seed,
        )


@dataclass
class DemoConfig(CheckedConfig):
    """The backbone, the corpus and the :class:`DemoBudgetConfig`."""

    model: str | None = backbone_option()
    corpus: list[str] | None = corpus_option()
    device: str = device_option(help="device of locate, bridge training and sampling: " + DEVICE_HELP)
    dtype: str = dtype_option()
    resume: bool = option(False, RESUME_HELP)
    overwrite: bool = option(False, OVERWRITE_HELP)
    settings: DemoBudgetConfig = field(default_factory=DemoBudgetConfig, metadata={"help": "sizes of the demo"})


class StageClock:
    """Wall time of each stage in ``RUN/timings.json``; a reused stage keeps the time it took when computed."""

    def __init__(self, path: Path):
        self.path = path
        self.times = read_json(path, "stage timings") if path.is_file() else {}

    def run(self, name: str, fn, done: bool):
        logger.info("demo stage %s: %s", name, "reusing its finished output" if done else "running")
        poll_threads()
        start = time.perf_counter()
        result = fn()
        if not done or name not in self.times:
            self.times[name] = {"seconds": time.perf_counter() - start, "reused": done}
            atomic_write_json(self.path, self.times)
        return result


def demo(config: DemoConfig, out: str | Path) -> DemoReport:
    """Seed everything with ``settings.seed``, then run (or resume) the whole pipeline in run directory ``out``
    (holding its lock) and write ``report.md``, ``report.json`` and ``samples.json``."""
    from dihal_fast.common import seed_everything
    from dihal_fast.common.rundir import run_directory

    seed_everything(config.settings.seed)
    with run_directory(out, "dihal demo", resume=config.resume, overwrite=config.overwrite, resume_hint=RESUME_HINT):
        return DemoReport(Path(out), _demo(config, corpus_or_default(config.corpus), Path(out)))


def _demo(config: DemoConfig, corpus: list[str], out: Path) -> dict:
    model, settings = config.model, config.settings
    placement = {"device": config.device, "dtype": config.dtype}
    clock = StageClock(out / "timings.json")
    locate_config = dataclasses.replace(settings.locate_config(model, corpus), **placement)
    locate = clock.run(
        "locate", lambda: ensure_locate(out / "locate", locate_config), (out / "locate" / "locate.json").is_file()
    )
    layer = locate["selected_layer"]
    train = clock.run(
        "replace",
        lambda: ensure_replace(
            out / "replace", model, layer, corpus, dataclasses.replace(settings.train_config(), **placement)
        ),
        (out / "replace" / "result.json").is_file(),
    )
    evaluation_config = EvaluateConfig(
        hybrid=str(out / "replace"),  # the run's result.json names the hybrid and its backbone
        corpus=corpus,
        evaluator=model,
        settings=settings.evaluation,
        diffusion_lm_steps=settings.train_steps if settings.diffusion_lm else 0,
    )
    # The evaluate stage seeds the global RNGs itself, so its numbers do not depend on whether the
    # earlier stages ran in this invocation or were reused from a previous one.
    check_inputs(out, "evaluate", {"evaluate": evaluation_config})
    evaluation = clock.run(
        "evaluate",
        lambda: dict(evaluate_stage(evaluation_config, out / "evaluate").data),
        (out / "evaluate" / "evaluate.json").is_file(),
    )

    prompts = GenerateConfig(
        model=str(train["hybrid_dir"]),
        prompt=list(PROMPTS),
        n_samples=2,
        max_new_tokens=48,
        seed=settings.seed,
        device=config.device,
    )
    check_inputs(out, "samples.json", {"generate": prompts})

    def generate_samples() -> dict:
        if (out / "samples.json").is_file():
            return read_json(out / "samples.json", "demo samples")
        return dict(generate(prompts, out / "samples.json").data)

    samples = clock.run("generate", generate_samples, (out / "samples.json").is_file())
    summary = {
        "model": locate["model"],
        "corpus": corpus,
        "settings": {**asdict(settings), "evaluation": asdict(settings.evaluation)},
        "selected_layer": layer,
        "locate": {k: locate[k] for k in ("n_tokens", "n_layers", "candidate_layers", "layers", "selected_layer")},
        "replace": {k: train.get(k) for k in ("layer", "steps", "bridge_loss", "validation", "hybrid_dir")},
        "evaluate": {k: v for k, v in evaluation.items() if k != "samples"},
        "targets": md.targets(evaluation),
        "timings": clock.times,
    }
    atomic_write_json(out / "report.json", summary)
    write_markdown(out, summary, evaluation, samples)
    return summary


def write_markdown(out: Path, summary: dict, evaluation: dict, samples: dict) -> Path:
    """``RUN/report.md``: summary, per-stage tables, plots inline, samples, how to reproduce."""
    t, hybrid, backbone = summary["targets"], evaluation["hybrid"], evaluation["backbone"]
    total = sum(v["seconds"] for v in summary["timings"].values())
    overview = md.table(
        ["", "value"],
        [
            ["backbone", f"`{summary['model']}`"],
            ["selected layer l*", summary["selected_layer"]],
            [
                "hybrid PPL / backbone PPL",
                f"{hybrid['ppl']:.4g} / {backbone['ppl']:.4g} = {t['ppl_ratio']:.3f} "
                f"(target <= {t['ppl_ratio_target']}: {'met' if t['ppl_ratio_met'] else 'missed'})",
            ],
            ["KL(backbone || hybrid)", hybrid["kl"]],
            [
                "tokens/s hybrid / backbone",
                f"{hybrid['tokens_per_s']:.4g} / {backbone['tokens_per_s']:.4g} = {t['tokens_per_s_ratio']:.3f}",
            ],
            [
                "stage times (s)",
                ", ".join(
                    f"{k} {v['seconds']:.0f}" + (" (reused)" if v["reused"] else "")
                    for k, v in summary["timings"].items()
                )
                + f"; total {total:.0f}",
            ],
        ],
    )
    replace = summary["replace"]
    validation = replace.get("validation") or {}
    sections = [
        ("Summary", overview),
        (
            "Locate: geometry per layer",
            md.locate_table(summary["locate"])
            + "\n\n"
            + md.image(out / "locate" / "geometry.png", out, "proxies and score against depth"),
        ),
        (
            "Replace: bridge training",
            md.table(
                ["", "value"],
                [
                    ["layer", replace["layer"]],
                    ["steps", replace["steps"]],
                    ["validation bridge loss", replace["bridge_loss"]],
                    ["validation PPL ratio (train's own check)", validation.get("ppl_ratio")],
                ],
            )
            + "\n\n"
            + md.image(out / "replace" / "loss_curve.png", out, "training losses"),
        ),
        (
            "Evaluate: hybrid against backbone and controls",
            md.metrics_table(evaluation)
            + "\n\nProtocol:\n\n"
            + "\n".join(f"- **{k}**: {v}" for k, v in evaluation["protocol"].items()),
        ),
        ("Samples (unconditional, evaluation protocol)", md.samples_block(evaluation["samples"])),
        (
            "Samples from prompts (hybrid)",
            "\n".join(f"> **{s['prompt']}**{' '.join(s['text'].split())}\n" for s in samples["samples"]),
        ),
        (
            "Reproduce",
            "```\ndihal demo --out RUN   # reruns reuse finished stages\n"
            f"dihal generate --model {replace['hybrid_dir']} --prompt 'Once upon a time'\n```",
        ),
    ]
    return md.write_report(out / "report.md", "DiHAL demo: locate, replace, evaluate, generate", sections)
