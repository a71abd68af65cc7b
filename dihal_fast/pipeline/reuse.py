"""Stages that reuse whatever a run directory already holds, so that ``sweep`` and ``demo`` resume:
a finished stage is read back, an unfinished one continues from its checkpoints."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from dihal_fast.common import read_json

logger = logging.getLogger(__name__)


def ensure_locate(out: Path, config) -> dict:
    """``out/locate.json``, computed by :func:`~dihal_fast.pipeline.locate` with ``config`` (a
    :class:`~dihal_fast.pipeline.LocateConfig`) unless present; a checkpointed collection resumes."""
    from dihal_fast.pipeline.locate_stage import locate

    report = out / "locate.json"
    if report.is_file():
        logger.info("reusing %s", report)
        return read_json(report, "locate report")
    config = dataclasses.replace(config, resume=(out / "collect" / "config.json").is_file())
    logger.info("locate into %s: %s", out, config)
    if not locate(config, out).complete:
        raise RuntimeError(f"the locate stage in {out} stopped before the end of its collection")
    return read_json(report, "locate report")


def ensure_replace(out: Path, model: str | Path | None, layer: int, corpus: list[str], config) -> dict:
    """The bridge training summary (``bridge_loss``, ``hybrid_dir``, ...) for ``layer`` in ``out``, with
    ``config`` (a :class:`~dihal_fast.replace.config.BridgeTrainConfig`): read from ``out/result.json`` when the run
    finished, else trained by :func:`~dihal_fast.pipeline.replace` (resuming from its latest checkpoint)."""
    from dihal_fast.pipeline.replace_stage import ReplaceConfig, replace

    result = out / "result.json"
    if result.is_file():
        logger.info("reusing the finished bridge training in %s", out)
        return read_json(result, "bridge training summary")
    logger.info("replace: training a bridge for layer %d in %s (%d steps)", layer, out, config.steps)
    replace_config = ReplaceConfig(
        model=None if model is None else str(model), layer=layer, corpus=list(corpus), resume=True, train=config
    )
    return dict(replace(replace_config, out).data)
