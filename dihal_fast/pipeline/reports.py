"""What every stage function returns: its output location and the report it wrote there.

A report reads like the JSON it wrote (``report["selected_layer"]``, ``report.get(...)``, ``dict(report)``);
the properties name the fields other stages and users reach for most.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, eq=False)
class StageReport(Mapping):
    """``out``: the run directory (or output file) of the stage; ``data``: the report written there."""

    out: Path | None
    data: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


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
