"""Stages that reuse whatever a run directory already holds, so that ``sweep`` and ``demo`` resume: a finished
stage is read back, an unfinished one continues from its checkpoints; and the one check that a part of a run
is reused only with the inputs it was made from.

:func:`check_inputs` records the inputs of each part of a run (a stage folder, a layer's bridge, a samples
file) in the run's marker (:mod:`dihal_fast.common.rundir`) before the part is computed; a rerun that asks
for the same part with other inputs (budget, steps, seed, model, corpus, ...) is refused in one line naming
each changed field, never relabelled: ``--overwrite`` recomputes the run, or choose a new ``--out``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from dihal_fast.common import read_json
from dihal_fast.common.rundir import OVERWRITE_HELP, RESUME_HINT, read_marker, update_marker
from dihal_fast.errors import DihalValueError

logger = logging.getLogger(__name__)

__all__ = ["OVERWRITE_HELP", "RESUME_HELP", "RESUME_HINT", "check_inputs", "ensure_locate", "ensure_replace"]

# The flags of the commands that reuse a run directory (sweep, demo).
RESUME_HELP = (
    "continue the run in the run directory (a rerun continues anyway; --resume also adopts a run directory "
    "written by an earlier dihal_fast, which has no run marker)"
)

# Fields that say how a stage runs, not what it computes: not compared.
_HOW = frozenset(
    {"resume", "overwrite", "max_batches", "checkpoint_every", "save_every", "log_every", "keep_checkpoints"}
)


def _plain(value: Any) -> Any:
    """``value`` as the JSON it is recorded as (dataclass configs as dicts, tuples as lists), without :data:`_HOW`."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = value.to_dict() if hasattr(value, "to_dict") else dataclasses.asdict(value)
    plain = json.loads(json.dumps(value, default=str))
    return {k: v for k, v in plain.items() if k not in _HOW} if isinstance(plain, dict) else plain


def _differences(saved: Any, wanted: Any, prefix: str = "") -> list[str]:
    """``field: saved -> wanted`` for every (dotted) field that differs."""
    if isinstance(saved, dict) and isinstance(wanted, dict):
        return [
            line
            for key in sorted(set(saved) | set(wanted))
            for line in _differences(saved.get(key), wanted.get(key), f"{prefix}{key}.")
        ]
    return [] if saved == wanted else [f"{prefix.rstrip('.') or 'inputs'} {saved!r} -> {wanted!r}"]


def check_inputs(run: Path, part: str, inputs: Mapping[str, Any]) -> None:
    """Record ``inputs`` of ``part`` of run directory ``run`` (held by this process; ``part`` ``""``: the run
    itself), or refuse in one line when the run recorded other inputs for it (see the module doc)."""
    wanted = {key: _plain(value) for key, value in inputs.items()}
    recorded = read_marker(run).get("inputs")
    recorded = recorded if isinstance(recorded, dict) else {}
    if part not in recorded:
        update_marker(run, inputs={**recorded, part: wanted})
        return
    changed = _differences(recorded[part], wanted)
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


def ensure_locate(out: Path, config) -> dict:
    """``out/locate.json``, computed by :func:`~dihal_fast.pipeline.locate` with ``config`` (a
    :class:`~dihal_fast.pipeline.LocateConfig`) unless present; a checkpointed collection resumes. ``out`` is a
    folder of the run this process holds, whose marker records the inputs (:func:`check_inputs`)."""
    from dihal_fast.pipeline.locate_stage import locate

    check_inputs(out.parent, out.name, {"locate": config})
    report = out / "locate.json"
    if report.is_file():
        logger.info("reusing %s", report)
        return read_json(report, "locate report")
    config = dataclasses.replace(config, resume=(out / "collect" / "config.json").is_file())
    logger.info("locate into %s: %s", out, config)
    if not locate(config, out).complete:
        raise RuntimeError(f"the locate stage in {out} stopped before the end of its collection")
    return read_json(report, "locate report")


def finished_replace(out: Path, model: str | Path | None, layer: int, corpus: list[str], config) -> dict | None:
    """The summary ``out/result.json`` of a finished bridge training made with these inputs, None when it has not
    finished (refused when it was made with others: :func:`check_inputs` on ``out``'s parent run)."""
    check_inputs(out.parent, out.name, replace_inputs(model, layer, corpus, config))
    result = out / "result.json"
    return read_json(result, "bridge training summary") if result.is_file() else None


def ensure_replace(out: Path, model: str | Path | None, layer: int, corpus: list[str], config) -> dict:
    """The bridge training summary (``bridge_loss``, ``hybrid_dir``, ...) for ``layer`` in ``out``, with
    ``config`` (a :class:`~dihal_fast.replace.config.BridgeTrainConfig`): read from ``out/result.json`` when the run
    finished with these inputs, else trained by :func:`~dihal_fast.pipeline.replace` (resuming from its latest
    checkpoint)."""
    from dihal_fast.pipeline.replace_stage import ReplaceConfig, replace

    finished = finished_replace(out, model, layer, corpus, config)
    if finished is not None:
        logger.info("reusing the finished bridge training in %s", out)
        return finished
    logger.info("replace: training a bridge for layer %d in %s (%d steps)", layer, out, config.steps)
    replace_config = ReplaceConfig(
        model=None if model is None else str(model), layer=layer, corpus=list(corpus), resume=True, train=config
    )
    return dict(replace(replace_config, out).data)
