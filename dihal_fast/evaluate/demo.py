"""The end-to-end main job: locate -> replace -> evaluate -> generate, then ``report.md`` / ``report.json``.

Every stage writes into its own folder of the run directory and is skipped when its output is there,
so an interrupted demo continues where it stopped (bridge training resumes from its checkpoint)."""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dihal_fast.common import atomic_write_json, read_json
from dihal_fast.cpu_threads import poll_threads
from dihal_fast.evaluate import report as md
from dihal_fast.evaluate.harness import EvalSettings
from dihal_fast.evaluate.stages import ensure_locate, ensure_replace

logger = logging.getLogger(__name__)

PROMPTS = ("It was a bright cold day in April, and", "The President said that", "Once upon a time")


@dataclass
class DemoSettings:
    """Sizes of the demo, chosen to finish in about 15 minutes on 2 CPU cores with the shipped backbone."""

    locate_max_tokens: int = 16384
    locate_repeats: int = 5
    locate_sample: int = 1000
    seq_len: int = 128
    train_steps: int = 200
    batch_size: int = 8
    val_blocks: int = 32
    diffusion_lm: bool = True
    seed: int = 0
    evaluation: EvalSettings = field(default_factory=lambda: EvalSettings(eval_blocks=32, n_samples=16, max_new_tokens=64))

    def __post_init__(self) -> None:
        if self.evaluation.seq_len != self.seq_len or self.evaluation.eval_blocks > self.val_blocks:
            raise ValueError(
                f"the evaluation blocks must lie in the tail the bridge never trains on: need the same seq-len "
                f"({self.evaluation.seq_len} vs {self.seq_len}) and eval-blocks <= val-blocks "
                f"({self.evaluation.eval_blocks} vs {self.val_blocks})")

    def train_config(self):
        from dihal_fast.train.config import TrainConfig

        return TrainConfig(steps=self.train_steps, seq_len=self.seq_len, batch_size=self.batch_size,
                           val_blocks=self.val_blocks, seed=self.seed)


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


def run_demo(out: str | Path, model: str | None, corpus: list[str], settings: DemoSettings) -> dict:
    """Run (or resume) the whole pipeline in ``out`` and write ``report.md``, ``report.json``, ``samples.json``."""
    from dihal_fast.cli.generate import generate_texts
    from dihal_fast.evaluate.models import load_lm
    from dihal_fast.evaluate.run import evaluate_hybrid

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    clock = StageClock(out / "timings.json")
    options = ["--max-tokens", settings.locate_max_tokens, "--repeats", settings.locate_repeats,
               "--sample-size", settings.locate_sample, "--seq-len", settings.seq_len, "--seed", settings.seed]
    locate = clock.run("locate", lambda: ensure_locate(out / "locate", model, corpus, options),
                       (out / "locate" / "locate.json").is_file())
    layer = locate["selected_layer"]
    train = clock.run("replace", lambda: ensure_replace(out / "replace", model, layer, corpus, settings.train_config()),
                      (out / "replace" / "result.json").is_file())
    evaluation = clock.run("evaluate", lambda: evaluate_hybrid(
        train["hybrid_dir"], corpus, out / "evaluate", settings.evaluation, evaluator_path=model,
        diffusion_lm_steps=settings.train_steps if settings.diffusion_lm else None),
        (out / "evaluate" / "evaluate.json").is_file())

    def generate() -> dict:
        if (out / "samples.json").is_file():
            return read_json(out / "samples.json", "demo samples")
        hybrid = load_lm(train["hybrid_dir"])
        samples = generate_texts(hybrid, list(PROMPTS), 2, 48, seed=settings.seed)
        atomic_write_json(out / "samples.json", samples)
        return samples

    samples = clock.run("generate", generate, (out / "samples.json").is_file())
    summary = {
        "model": locate["model"], "corpus": corpus, "settings": asdict(settings), "selected_layer": layer,
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
    overview = md.table(["", "value"], [
        ["backbone", f"`{summary['model']}`"],
        ["selected layer l*", summary["selected_layer"]],
        ["hybrid PPL / backbone PPL", f"{hybrid['ppl']:.4g} / {backbone['ppl']:.4g} = {t['ppl_ratio']:.3f} "
         f"(target <= {t['ppl_ratio_target']}: {'met' if t['ppl_ratio_met'] else 'missed'})"],
        ["KL(backbone || hybrid)", hybrid["kl"]],
        ["tokens/s hybrid / backbone", f"{hybrid['tokens_per_s']:.4g} / {backbone['tokens_per_s']:.4g} = "
         f"{t['tokens_per_s_ratio']:.3f}"],
        ["stage times (s)", ", ".join(f"{k} {v['seconds']:.0f}" + (" (reused)" if v["reused"] else "")
                                      for k, v in summary["timings"].items()) + f"; total {total:.0f}"],
    ])
    replace = summary["replace"]
    validation = replace.get("validation") or {}
    sections = [
        ("Summary", overview),
        ("Locate: geometry per layer", md.locate_table(summary["locate"]) + "\n\n"
         + md.image(out / "locate" / "geometry.png", out, "proxies and score against depth")),
        ("Replace: bridge training", md.table(["", "value"], [
            ["layer", replace["layer"]], ["steps", replace["steps"]],
            ["validation bridge loss", replace["bridge_loss"]],
            ["validation PPL ratio (train's own check)", validation.get("ppl_ratio")]])
         + "\n\n" + md.image(out / "replace" / "loss_curve.png", out, "training losses")),
        ("Evaluate: hybrid against backbone and controls", md.metrics_table(evaluation) + "\n\nProtocol:\n\n"
         + "\n".join(f"- **{k}**: {v}" for k, v in evaluation["protocol"].items())),
        ("Samples (unconditional, evaluation protocol)", md.samples_block(evaluation["samples"])),
        ("Samples from prompts (hybrid)", "\n".join(
            f"> **{s['prompt']}**{' '.join(s['text'].split())}\n" for s in samples["samples"])),
        ("Reproduce", "```\ndihal demo --out RUN   # reruns reuse finished stages\n"
         f"dihal generate --model {replace['hybrid_dir']} --prompt 'Once upon a time'\n```"),
    ]
    return md.write_report(out / "report.md", "DiHAL demo: locate, replace, evaluate, generate", sections)
