"""What each DiHAL stage function returns: :class:`~dihal_fast.common.reports.StageReport` with the properties
that name the fields other stages and users reach for most."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dihal_fast.common.reports import StageReport

__all__ = [
    "DemoReport",
    "EvaluateReport",
    "GenerateReport",
    "LocateReport",
    "ReplaceReport",
    "StageReport",
    "SweepReport",
]


@dataclass(frozen=True, eq=False)
class LocateReport(StageReport):
    """``RUN/locate.json``; ``complete`` is False when ``max_batches`` stopped the collection (resume it),
    and ``data`` is empty then and on the non-zero ranks of a multi-process run."""

    complete: bool = True

    @property
    def selected_layer(self) -> int:
        return self.data["selected_layer"]


@dataclass(frozen=True, eq=False)
class ReplaceReport(StageReport):
    """Bridge training's summary (``RUN/result.json``): ``bridge_loss``, ``validation``, ``hybrid_dir``, ..."""

    @property
    def hybrid_dir(self) -> Path:
        return Path(self.data["hybrid_dir"])


class EvaluateReport(StageReport):
    """``RUN/evaluate.json``: ``backbone``, ``hybrid`` and ``controls`` sections, ``protocol``, ``samples``."""


class GenerateReport(StageReport):
    """``samples`` (prompt, text, token ids), ``tokens_per_s``, ``seconds``; ``out`` is the JSON file or None."""


class SweepReport(StageReport):
    """``RUN/sweep.json``: per-layer score and bridge loss, their correlations and the rank gap."""


class DemoReport(StageReport):
    """``RUN/report.json`` (``RUN/report.md`` beside it): the summary of every stage and the targets."""
