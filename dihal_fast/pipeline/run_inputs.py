"""The one check that a part of a run is reused only with the inputs it was made from.

:func:`check_inputs` records the inputs of each part of a run (a stage folder, a layer's bridge, a samples
file) in the run's marker (:mod:`dihal_fast.common.rundir`) before the part is computed; a rerun that asks
for the same part with other inputs (budget, steps, seed, model, corpus, ...) is refused in one line naming
each changed field, never relabelled: ``--overwrite`` recomputes the run, or choose a new ``--out``. A ``model``
that is a GGUF file is recorded with the file's sha256 (``model_sha256``): a run resumes only on the same bytes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from dihal_fast.common.hf_loading import file_sha256, is_gguf_file
from dihal_fast.common.launch import launcher_env
from dihal_fast.common.rundir import read_marker, update_marker
from dihal_fast.errors import DihalValueError

# Fields that say how a stage runs, not what it computes: not compared.
_HOW = frozenset(
    {
        "resume",
        "overwrite",
        "max_batches",
        "checkpoint_every",
        "checkpoint_minutes",
        "save_every",
        "log_every",
        "keep_checkpoints",
    }
)


def _plain(value: Any) -> Any:
    """``value`` as the JSON it is recorded as (dataclass configs as dicts, tuples as lists), without :data:`_HOW`."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = value.to_dict() if hasattr(value, "to_dict") else dataclasses.asdict(value)
    plain = json.loads(json.dumps(value, default=str))
    return {k: v for k, v in plain.items() if k not in _HOW} if isinstance(plain, dict) else plain


def _pinned(plain: Any) -> Any:
    """``plain`` with ``model_sha256`` beside a ``model`` that names a GGUF file (a path names no content)."""
    if isinstance(plain, dict) and isinstance(plain.get("model"), str) and is_gguf_file(plain["model"]):
        return {**plain, "model_sha256": file_sha256(plain["model"])}
    return plain


def _differences(saved: Any, wanted: Any, prefix: str = "") -> list[str]:
    """``field: saved -> wanted`` for every (dotted) field that differs."""
    if isinstance(saved, dict) and isinstance(wanted, dict):
        return [
            line
            for key in sorted(set(saved) | set(wanted))
            for line in _differences(saved.get(key), wanted.get(key), f"{prefix}{key}.")
        ]
    return [] if saved == wanted else [f"{prefix.rstrip('.') or 'inputs'} {saved!r} -> {wanted!r}"]


def _with_legacy(saved: Any, wanted: Any, legacy: Mapping[str, Mapping[str, Any]]) -> Any:
    """``saved`` inputs with the fields that ``wanted`` compares and a config gained since they were recorded set
    to the values those runs used (``legacy``: input name -> the config class's ``legacy``), so that a run of an
    older release resumes."""
    if not isinstance(saved, dict) or not isinstance(wanted, dict):
        return saved
    filled = dict(saved)
    for key, fields in legacy.items():
        if isinstance(filled.get(key), dict) and isinstance(wanted.get(key), dict):
            added = {k: v for k, v in _plain(dict(fields)).items() if k in wanted[key]}
            filled[key] = {**added, **filled[key]}
    return filled


def check_inputs(
    run: Path, part: str, inputs: Mapping[str, Any], legacy: Mapping[str, Mapping[str, Any]] | None = None
) -> None:
    """Record ``inputs`` of ``part`` of run directory ``run`` (held by this process; ``part`` ``""``: the run
    itself), or refuse in one line when the run recorded other inputs for it (see the module doc); ``legacy``
    (input name -> its config's ``legacy``) fills the fields a run of an older release did not record.

    Only global rank 0 checks and records: it holds the run (:func:`~dihal_fast.common.rundir.run_directory`),
    and another rank that ran ahead would write the marker before rank 0 claimed the directory."""
    if launcher_env().rank != 0:
        return
    wanted = _pinned({key: _pinned(_plain(value)) for key, value in inputs.items()})
    recorded = read_marker(run).get("inputs")
    recorded = recorded if isinstance(recorded, dict) else {}
    if part not in recorded:
        update_marker(run, inputs={**recorded, part: wanted})
        return
    changed = _differences(_with_legacy(recorded[part], wanted, legacy or {}), wanted)
    if changed:
        shown = "; ".join(changed[:4]) + (f"; and {len(changed) - 4} more" if len(changed) > 4 else "")
        raise DihalValueError(
            f"{Path(run) / part} was made with other inputs than this run asks ({shown}); rerun with --overwrite to "
            "compute the run again (only its own files are removed) or choose a new --out"
        )


def replace_inputs(
    model: str | Path | None, layer: int, corpus: list[str], config, ignore: Collection[str] = ()
) -> dict:
    """What a bridge training's result depends on: the model, the layer, the corpus, its training config (less the
    fields in ``ignore``)."""
    train = {k: v for k, v in _plain(config).items() if k not in ignore}
    return {"model": None if model is None else str(model), "layer": layer, "corpus": list(corpus), "train": train}
