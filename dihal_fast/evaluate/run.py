"""``evaluate.json``: the hybrid against its backbone, plus the same-budget controls, resumable per section."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

import torch

from dihal_fast.common import atomic_write_json, read_json
from dihal_fast.corpus import token_convention
from dihal_fast.errors import DihalValueError
from dihal_fast.evaluate.harness import (
    EvalProtocolConfig,
    evaluate_lm,
    heldout_blocks,
    report_header,
    sample_metrics,
)
from dihal_fast.evaluate.loaded_lm import LoadedLM, same_tokenizer
from dihal_fast.evaluate.models import EvaluatedModels, load_backbone_and_evaluator, load_hybrid_on

logger = logging.getLogger(__name__)


def check_compatible(lm: LoadedLM, evaluator: LoadedLM, retokenise: bool) -> None:
    """A model scored by an evaluator with another tokenizer is an error unless retokenisation is asked for."""
    if not retokenise and not same_tokenizer(lm.tokenizer, evaluator.tokenizer):
        raise DihalValueError(
            f"the {lm.kind} at {lm.path} comes from the backbone {lm.backbone_dir}, whose tokenizer differs from the "
            f"evaluator's ({evaluator.path}); pass --evaluator {lm.backbone_dir} (or another model with the same "
            "tokenizer), or --retokenise to score decoded text under a different tokenizer on purpose"
        )


class SectionStore:
    """Finished report sections as ``RUN/sections/<name>.json``, reused when the settings and the documents'
    special tokens (``documents``, :meth:`~dihal_fast.corpus.TokenConvention.describe`) match."""

    def __init__(self, out_dir: Path, settings: EvalProtocolConfig, documents: str):
        self.dir, self.settings = out_dir / "sections", {**asdict(settings), "documents": documents}

    def get(self, name: str) -> tuple[dict, list[str]] | None:
        path = self.dir / f"{name}.json"
        if not path.is_file():
            return None
        saved = read_json(path, f"saved section {name}")
        if saved.get("settings") != self.settings:
            logger.info("settings changed since %s was written; recomputing it", path)
            return None
        logger.info("reusing the finished %s section from %s", name, path)
        return saved["section"], saved["samples"]

    def put(self, name: str, section: dict, samples: list[str]) -> None:
        atomic_write_json(
            self.dir / f"{name}.json", {"settings": self.settings, "section": section, "samples": samples}
        )


def evaluate_hybrid(
    models: EvaluatedModels,
    corpus,
    out_dir: str | Path,
    settings: EvalProtocolConfig,
    *,
    retokenise: bool = False,
    diffusion_lm_steps: int | None = None,
    tasks: list[str] | None = None,
    task_limit: int | None = None,
) -> dict:
    """Evaluate ``models`` (:func:`~dihal_fast.evaluate.models.resolve_models`: the hybrid, its backbone, the
    evaluator, the controls and their placement) and write ``out_dir/evaluate.json``.

    The backbone loads once in the placement's dtype (``auto``: its own) and the hybrid is built on it
    (:func:`~dihal_fast.evaluate.models.load_hybrid_on`: one copy of the shared weights; a hybrid's bridge stays
    float32); the evaluator is that same model when it is the backbone in that dtype. The controls (``oracle``,
    ``worst``, ...: other hybrid directories) are scored in the same harness; ``diffusion_lm_steps`` trains the
    Diffusion-LM-like control for that many steps; ``tasks`` are lm-evaluation-harness tasks run on every scored
    model (``report["downstream"]``, :func:`dihal_fast.evaluate.downstream.downstream_report`), ``task_limit``
    keeps their first N examples. Samples are drawn in float64 from a CPU generator (the draws do not depend on
    the device).
    """
    out_dir = Path(out_dir)
    backbone, evaluator = load_backbone_and_evaluator(models)
    hybrid = load_hybrid_on(backbone, models.hybrid, settings.nfe, settings.bridge_dtype)
    check_compatible(hybrid, evaluator, retokenise)
    if not same_tokenizer(hybrid.tokenizer, backbone.tokenizer):
        raise DihalValueError(f"the hybrid at {hybrid.path} does not share its backbone's ({backbone.path}) tokenizer")
    heldout = heldout_blocks(backbone.tokenizer, corpus, settings)
    blocks = heldout.blocks
    documents = token_convention(backbone.tokenizer).describe()
    store = SectionStore(out_dir, settings, documents)
    report = report_header(settings, heldout, evaluator, documents)
    report["n_heldout_tokens"] = int(blocks.numel())
    samples: dict[str, list[str]] = {}

    def section(name: str, compute) -> dict:
        found = store.get(name)
        if found is None:
            found = compute()
            store.put(name, *found)
        samples[name] = found[1]
        return found[0]

    report["backbone"] = section("backbone", lambda: evaluate_lm(backbone, blocks, settings, evaluator))
    report["hybrid"] = section("hybrid", lambda: evaluate_lm(hybrid, blocks, settings, evaluator, reference=backbone))
    report["controls"] = {}
    scored = {"backbone": backbone, "hybrid": hybrid}
    for name, path in models.controls.items():
        control = models.placement.load(path, nfe=settings.nfe, bridge_dtype=settings.bridge_dtype)
        check_compatible(control, backbone, retokenise=False)
        scored[name] = control
        report["controls"][name] = section(
            name, lambda c=control: evaluate_lm(c, blocks, settings, evaluator, reference=backbone)
        )
    if diffusion_lm_steps:
        report["controls"]["diffusion_lm"] = section(
            "diffusion_lm",
            lambda: _diffusion_lm_section(backbone, corpus, out_dir, settings, evaluator, diffusion_lm_steps),
        )
    if tasks:
        from dihal_fast.evaluate.downstream import downstream_report

        report["downstream"] = downstream_report(
            {name: (lm.model, lm.tokenizer) for name, lm in scored.items()},
            tasks,
            store,
            settings.batch_size,
            task_limit,
            settings.seed,
        )
    report["samples"] = samples
    atomic_write_json(out_dir / "evaluate.json", report)
    return report


def _diffusion_lm_section(
    backbone: LoadedLM, corpus, out_dir: Path, settings: EvalProtocolConfig, evaluator, steps: int
):
    import time

    from dihal_fast.controls import DiffusionLMConfig, train_diffusion_lm
    from dihal_fast.corpus import read_texts, token_blocks
    from dihal_fast.evaluate.generation import Generation

    config = DiffusionLMConfig(seq_len=settings.max_new_tokens, steps=steps, seed=settings.seed)
    blocks = token_blocks(backbone.tokenizer, read_texts(corpus), config.seq_len)
    n_train = blocks.shape[0] - max(1, (settings.eval_blocks * settings.seq_len) // config.seq_len)
    if n_train < 1:
        raise DihalValueError("the corpus is too small to train the Diffusion-LM control outside the held-out blocks")
    embedding = backbone.model.get_input_embeddings().weight.detach().cpu()  # the control trains on the CPU
    control = train_diffusion_lm(embedding, blocks[:n_train], config, out_dir / "diffusion_lm")
    start = time.perf_counter()
    tokens = control.sample(
        settings.n_samples,
        settings.max_new_tokens,
        settings.nfe or config.nfe,
        torch.Generator().manual_seed(settings.seed),
    )
    generation = Generation(tokens, time.perf_counter() - start)
    metrics_, texts = sample_metrics(generation, backbone.tokenizer, evaluator)
    unavailable = "not defined: the control has no tractable likelihood"
    return {
        "model": str(out_dir / "diffusion_lm"),
        "kind": "diffusion_lm",
        "config": asdict(config),
        "n_parameters": sum(p.numel() for p in control.parameters()),
        "nll": None,
        "ppl": None,
        "kl": None,
        "likelihood_note": unavailable,
        **metrics_,
    }, texts
