"""The models one evaluation loads, resolved once: the hybrid, its backbone, the evaluator, the controls and
where they go (:class:`EvaluatedModels`), and the loading that keeps one copy of the backbone's weights.

A ``dihal replace`` run directory names its hybrid and the backbone it was trained from in ``result.json``
(``hybrid_dir``, ``model``); a hybrid directory is taken as is, with its backbone given explicitly (its
config's ``backbone_dir`` is provenance only, an absolute path that need not exist where the hybrid is
evaluated). Either backbone is checked against the shape the hybrid's config records of it
(``backbone_config``: family, layers, widths, vocabulary) before any weights load. The hybrid is then built on
the loaded backbone: its frozen retained layers, embeddings and head are the backbone's own tensors (each
checked equal to the hybrid's saved copy, one tensor at a time) and only its own weights (the bridge, trained
layers) are read from its files; an evaluator that is the backbone in the backbone's dtype is the same loaded
model. Peak memory is then one backbone in its dtype plus the bridge.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dihal_fast.common import read_json
from dihal_fast.common.devices import resolve_dtype
from dihal_fast.common.hf_loading import load_tokenizer, resolve_model_dir
from dihal_fast.errors import DihalValueError
from dihal_fast.evaluate.loaded_lm import (
    RESULT_NAME,
    LoadedLM,
    configure_bridge,
    is_hybrid_dir,
    load_lm,
    replace_run,
)
from dihal_fast.evaluate.scoring import evaluator_context

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    """Where and in what dtype the hybrid, its backbone and the controls load (the evaluator: its own dtype)."""

    device: str = "auto"
    dtype: str = "auto"
    device_map: str = "none"

    def load(
        self, path: str | Path | None, dtype: str | None = None, nfe: int | None = None, bridge_dtype: str | None = None
    ) -> LoadedLM:
        """``path`` loaded with this placement (``dtype`` overrides the placement's; ``nfe``, ``bridge_dtype``:
        :func:`~dihal_fast.evaluate.loaded_lm.configure_bridge`)."""
        return load_lm(path, dtype or self.dtype, self.device, nfe, self.device_map, bridge_dtype)


@dataclass(frozen=True)
class EvaluatedModels:
    """Every model of one evaluation as checked directories: ``evaluator`` None is the hybrid's backbone;
    ``controls`` maps a report name to a hybrid directory scored in the same harness."""

    hybrid: Path
    backbone: Path
    evaluator: Path | None = None
    evaluator_dtype: str = "auto"
    placement: Placement = field(default_factory=Placement)
    controls: dict[str, Path] = field(default_factory=dict)


def resolve_models(
    hybrid: str | Path,
    backbone: str | Path | None = None,
    evaluator: str | Path | None = None,
    evaluator_dtype: str = "auto",
    placement: Placement | None = None,
    controls: dict[str, str | Path] | None = None,
    seq_len: int | None = None,
) -> EvaluatedModels:
    """The models of an evaluation, each checked to be a directory before any weights load.

    ``hybrid`` is a hybrid directory or a ``dihal replace`` run directory; ``backbone`` (explicit) wins over the
    run's recorded one; with neither, refused in one line; ``seq_len`` (when given) is checked against the
    hybrid's context."""
    from dihal_fast.common.checkpoint_config import check_checkpoint_config

    path = Path(hybrid)
    if is_hybrid_dir(path):
        hybrid_dir, recorded = path, None
    elif (path / RESULT_NAME).is_file():
        hybrid_dir, recorded = replace_run(path)
    else:
        resolve_model_dir(path)  # no checkpoint at all: its own one line
        if seq_len is not None:
            check_checkpoint_config(path, seq_len)  # a damaged config.json: named before "not a hybrid"
        raise DihalValueError(
            f"--hybrid {hybrid} is not a hybrid directory (it is a plain checkpoint) nor a dihal replace run"
        )
    if seq_len is not None:
        check_checkpoint_config(hybrid_dir, seq_len)  # a bad config.json, a too long --seq-len
    chosen = backbone if backbone is not None else recorded
    if chosen is None:
        provenance = _hybrid_config(hybrid_dir).get("backbone_dir") or "no path"
        raise DihalValueError(
            f"the backbone of the hybrid {hybrid_dir} is not known here: pass --backbone DIR (the checkpoint it "
            f"was cut from; its config records {provenance} as provenance) or the dihal replace run directory "
            "as --hybrid"
        )
    named_by = "--backbone" if backbone is not None else f"the backbone {path / RESULT_NAME} names,"
    backbone_dir = check_backbone_shape(hybrid_dir, chosen, named_by)
    return EvaluatedModels(
        hybrid=hybrid_dir,
        backbone=backbone_dir,
        evaluator=backbone_dir if evaluator is None else resolve_model_dir(evaluator),
        evaluator_dtype=evaluator_dtype,
        placement=placement or Placement(),
        controls={name: Path(control) for name, control in (controls or {}).items()},
    )


# The fields of a backbone's config.json that fix its weights' shapes (GPT-2's names beside the usual ones).
BACKBONE_SHAPE_FIELDS = ("model_type", "num_hidden_layers", "n_layer", "hidden_size", "n_embd", "intermediate_size",
                         "n_inner", "num_attention_heads", "n_head", "num_key_value_heads", "vocab_size")  # fmt: skip


def _hybrid_config(hybrid_dir: Path) -> dict:
    config = read_json(hybrid_dir / "config.json", "hybrid config")
    return config if isinstance(config, dict) else {}


def check_backbone_shape(hybrid_dir: Path, backbone: str | Path, named_by: str) -> Path:
    """``backbone`` checked to be a checkpoint directory whose config has the shape the hybrid's config records
    of the backbone it was cut from (:data:`BACKBONE_SHAPE_FIELDS`); refused in one line naming the fields that
    differ and ``--backbone`` otherwise. The weights are compared when the hybrid is built on it
    (:func:`load_hybrid_on`)."""
    backbone_dir = resolve_model_dir(backbone)
    recorded = _hybrid_config(hybrid_dir).get("backbone_config")
    if not isinstance(recorded, dict) or not recorded:
        return backbone_dir
    actual = read_json(backbone_dir / "config.json", "backbone config")
    differ = [
        f"{name} {actual.get(name)!r} (the hybrid's backbone: {recorded[name]!r})"
        for name in BACKBONE_SHAPE_FIELDS
        if name in recorded and actual.get(name) != recorded[name]
    ]
    if differ:
        raise DihalValueError(
            f"{named_by} {backbone_dir} is not the checkpoint the hybrid in {hybrid_dir} was cut from: "
            f"{', '.join(differ)}; pass that checkpoint as --backbone"
        )
    return backbone_dir


def load_backbone_and_evaluator(models: EvaluatedModels) -> tuple[LoadedLM, LoadedLM]:
    """The backbone (placement's dtype) and the evaluator: the same loaded model when the evaluator is the
    backbone's checkpoint in the same dtype, else a second load."""
    backbone = models.placement.load(models.backbone)
    evaluator = models.evaluator or models.backbone
    same_dir = evaluator.resolve() == models.backbone.resolve()
    if same_dir and resolve_dtype(models.evaluator_dtype, evaluator) == backbone.model.dtype:
        logger.info("the evaluator is the loaded backbone (%s, %s)", models.backbone, backbone.model.dtype)
        return backbone, backbone
    return backbone, models.placement.load(evaluator, models.evaluator_dtype)


SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                      "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool}  # fmt: skip


def _saved_tensors(directory: Path):
    """``(name, tensor)`` of every tensor in a saved model's safetensors files, one at a time, read with plain
    reads (a memory map would count the whole file in the process's RSS while it is open)."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for name in files:
        with open(directory / name, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size))
            for key, entry in header.items():
                if key == "__metadata__":
                    continue
                start, end = entry["data_offsets"]
                handle.seek(8 + size + start)
                data = bytearray(handle.read(end - start))
                dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
                if dtype is None:
                    raise DihalValueError(f"{directory / name}: tensor {key} has unsupported dtype {entry['dtype']}")
                flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
                yield key, flat.reshape(entry["shape"])


@torch.no_grad()
def load_hybrid_on(
    backbone: LoadedLM, hybrid_dir: Path, nfe: int | None = None, bridge_dtype: str | None = None
) -> LoadedLM:
    """The hybrid saved in ``hybrid_dir`` built on the loaded ``backbone`` (see the module doc): its frozen
    tensors are the backbone's, refused in one line when they differ from the hybrid's saved copy (a backbone
    overwritten since training, or the wrong one); its bridge and trained layers come from its files."""
    from transformers import AutoConfig
    from transformers.initialization import no_init_weights

    from dihal_fast.hybrid import HybridLM

    config = AutoConfig.from_pretrained(hybrid_dir)
    options = {k: v for k, v in config.bridge.items() if k not in ("hidden_size", "condition_size", "layer")}
    with no_init_weights():  # every tensor is the backbone's or read below: a random init would be thrown away
        hybrid = HybridLM.from_backbone(
            backbone.model, config.layer, options, None, config.backbone_dir, freeze_upper=config.freeze_upper
        )
    hybrid.config = config
    state = hybrid.state_dict(keep_vars=True)
    own = {name for name, p in hybrid.named_parameters() if p.requires_grad} | {
        name for name in state if name.startswith("bridge.")
    }
    seen = set()
    for name, saved in _saved_tensors(hybrid_dir):
        target = state.get(name)
        if target is None or target.shape != saved.shape:
            raise DihalValueError(f"{hybrid_dir} holds {name} {tuple(saved.shape)}, which this hybrid does not have")
        if name in own:
            target.data.copy_(saved)
        elif not torch.equal(saved.to(device=target.device, dtype=target.dtype), target.data):
            raise DihalValueError(
                f"the backbone's {name} ({backbone.path}) differs from the one the hybrid in {hybrid_dir} was cut "
                "from; pass the checkpoint it was trained from as --backbone"
            )
        seen.add(name)
    missing = sorted(own - seen)
    if missing:
        raise DihalValueError(f"{hybrid_dir} lacks the hybrid's own weights {missing[:3]}: is the export complete?")
    hybrid.eval()
    tokenizer = load_tokenizer(hybrid_dir)
    hybrid.tokenizer = tokenizer
    configure_bridge(hybrid, nfe, bridge_dtype or config.bridge_dtype)
    logger.info("built the hybrid in %s on the loaded backbone %s", hybrid_dir, backbone.path)
    return LoadedLM("hybrid", hybrid_dir, hybrid, tokenizer, evaluator_context(hybrid, tokenizer))


def sweep_controls(sweep_dir: str | Path) -> dict[str, str]:
    """The oracle (lowest bridge loss) and worst (highest) layers' hybrid directories of a finished sweep."""
    report = read_json(Path(sweep_dir) / "sweep.json", "sweep report (from `dihal sweep`)")
    rows = report.get("layers") or []
    if not rows or any("hybrid_dir" not in r or "bridge_loss" not in r for r in rows):
        raise DihalValueError(f"{sweep_dir}/sweep.json lists no layers with hybrid_dir and bridge_loss")
    ordered = sorted(rows, key=lambda r: r["bridge_loss"])
    return {
        f"oracle_layer_{ordered[0]['layer']}": ordered[0]["hybrid_dir"],
        f"worst_layer_{ordered[-1]['layer']}": ordered[-1]["hybrid_dir"],
    }
