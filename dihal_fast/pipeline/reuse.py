"""Stages that reuse whatever a run directory already holds, so that ``sweep`` and ``demo`` resume: a finished
stage is read back, an unfinished one continues from its checkpoints, each only with the inputs it was made
from (:func:`dihal_fast.pipeline.run_inputs.check_inputs`).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from dihal_fast.common import read_json
from dihal_fast.common.rundir import OVERWRITE_HELP, RESUME_HINT
from dihal_fast.pipeline.run_inputs import check_inputs, replace_inputs

logger = logging.getLogger(__name__)

__all__ = ["OVERWRITE_HELP", "RESUME_HELP", "RESUME_HINT", "check_inputs", "ensure_locate", "ensure_replace"]

# The flags of the commands that reuse a run directory (sweep, demo).
RESUME_HELP = (
    "continue the run in the run directory (a rerun continues anyway; --resume also adopts a run directory "
    "written by an earlier dihal_fast, which has no run marker)"
)


def ensure_locate(out: Path, config) -> dict:
    """``out/locate.json``, computed by :func:`~dihal_fast.pipeline.locate` with ``config`` (a
    :class:`~dihal_fast.pipeline.LocateConfig`) unless present; a checkpointed collection resumes. ``out`` is a
    folder of the run this process holds, whose marker records the inputs (:func:`check_inputs`)."""
    from dihal_fast.pipeline.locate_stage import locate

    check_inputs(out.parent, out.name, {"locate": config}, legacy={"locate": config.legacy})
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
    check_inputs(out.parent, out.name, replace_inputs(model, layer, corpus, config), legacy={"train": config.legacy})
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
