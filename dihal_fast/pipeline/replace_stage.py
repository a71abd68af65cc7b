"""The replace stage: layers 1..l* of a causal LM replaced by a trained conditional diffusion bridge.

``replace(ReplaceConfig(layer=...), out)`` trains the bridge (:func:`dihal_fast.replace.train_bridge`, plain
torch or DeepSpeed ZeRO) and exports ``out/hybrid`` (``HybridLM.from_pretrained``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from dihal_fast.common.assets import backbone_option, corpus_option, corpus_or_default
from dihal_fast.common.checkpoint_config import check_checkpoint_config
from dihal_fast.common.devices import device_map_option
from dihal_fast.common.options import option
from dihal_fast.common.rundir import OVERWRITE_HELP
from dihal_fast.common.validation import CheckedConfig
from dihal_fast.errors import DihalValueError
from dihal_fast.pipeline.reports import ReplaceReport
from dihal_fast.replace.config import BridgeTrainConfig
from dihal_fast.train.settings import DEEPSPEED_HELP

logger = logging.getLogger(__name__)


@dataclass
class ReplaceConfig(CheckedConfig):
    """Which layer of which model, on which corpus, and the bridge training run (exactly one of ``layer``
    and ``from_locate``); every field is checked when built (:mod:`dihal_fast.common.validation`)."""

    model: str | None = backbone_option(", or locate.json's model with --from-locate")
    layer: int | None = option(None, "hidden state l* to rebuild (1..L-1); layers 1..l* are replaced", min=1)
    from_locate: str | None = option(
        None, "take l* from RUN/locate.json (selected_layer) written by dihal locate", metavar="RUN", path=True
    )
    corpus: list[str] | None = corpus_option(", or locate.json's corpus with --from-locate")
    val_corpus: str | None = option(None, "held-out corpus for validation (default: the tail of --corpus)", path=True)
    deepspeed: str | None = option(None, DEEPSPEED_HELP, metavar="CFG")
    device_map: str = device_map_option(
        help="placement of the frozen teacher and the retained layers in one process, for a backbone larger than "
        "one GPU: none (all on --device), an accelerate strategy (auto, balanced, balanced_low_0, sequential) over "
        "the process's GPUs, or a JSON map of module names to GPU indices ('{\"model.embed_tokens\": 0, ...}'); "
        "the bridge trains on the device of the input embedding; not with --deepspeed (needs accelerate)"
    )
    resume: bool = option(False, "continue from the newest checkpoint in the run directory")
    overwrite: bool = option(False, OVERWRITE_HELP)
    train: BridgeTrainConfig = field(default_factory=BridgeTrainConfig, metadata={"help": "bridge training options"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.layer is None) == (self.from_locate is None):
            raise DihalValueError("give exactly one of --layer and --from-locate (layer or from_locate)")


def _from_locate(run: str) -> tuple[int, str | None, list[str] | None]:
    """``(selected layer, model, corpus)`` of the locate run ``run`` (its ``locate.json``)."""
    from dihal_fast.common import read_json

    report = read_json(Path(run) / "locate.json", "locate report (dihal locate --out RUN)")
    layer = report.get("selected_layer") if isinstance(report, dict) else None
    if isinstance(layer, bool) or not isinstance(layer, int):  # true would mean layer 1
        raise DihalValueError(f"{Path(run) / 'locate.json'} has no integer 'selected_layer' (got {layer!r})")
    corpus = report.get("corpus")
    if corpus is not None and not (isinstance(corpus, list) and corpus and all(isinstance(p, str) for p in corpus)):
        raise DihalValueError(f"{Path(run) / 'locate.json'} has no list of corpus files (got {corpus!r})")
    return layer, report.get("model"), corpus


def replace(config: ReplaceConfig, out: str | Path) -> ReplaceReport:
    """Train the bridge for ``config``'s layer in run directory ``out`` (holding its lock) and export the
    hybrid; every process of a DeepSpeed job calls this and gets the summary."""
    from dihal_fast.common.hf_loading import resolve_model_dir
    from dihal_fast.common.rundir import RESUME_HINT, run_directory
    from dihal_fast.pipeline.run_inputs import check_inputs, replace_inputs
    from dihal_fast.replace import train_bridge
    from dihal_fast.replace.job import RESUMABLE_CHANGES
    from dihal_fast.replace.placement import check_replace_placement

    layer, model, corpus = config.layer, config.model, corpus_or_default(config.corpus)
    if config.from_locate is not None:
        layer, located_model, located_corpus = _from_locate(config.from_locate)
        if model is None:
            model = located_model
        elif located_model and resolve_model_dir(model).resolve() != Path(located_model).resolve():
            logger.warning("--model %s differs from the model %s that dihal locate measured", model, located_model)
        logger.info("layer %d from %s", layer, Path(config.from_locate) / "locate.json")
        if config.corpus is None and located_corpus is not None:
            corpus = located_corpus
            logger.info("corpus from %s: %s", Path(config.from_locate) / "locate.json", ", ".join(corpus))
    check_replace_placement(model, config.train.device, config.device_map, config.deepspeed)  # before the run dir
    with run_directory(out, "dihal replace", resume=config.resume, overwrite=config.overwrite, resume_hint=RESUME_HINT):
        check_checkpoint_config(model, config.train.seq_len)  # a bad config.json, a too long --seq-len
        inputs = replace_inputs(model, layer, corpus, config.train, RESUMABLE_CHANGES)
        check_inputs(  # --resume with another corpus
            Path(out), "", {**inputs, "val_corpus": config.val_corpus}, legacy={"train": config.train.legacy}
        )
        result = train_bridge(
            model,
            layer,
            corpus,
            out,
            config.train,
            deepspeed_config=config.deepspeed,
            resume=config.resume,
            val_corpus=config.val_corpus,
            device_map=config.device_map,
        )
    return ReplaceReport(Path(out), result)
