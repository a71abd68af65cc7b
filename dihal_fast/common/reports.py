"""What every stage and family entry point returns: its output location and the report it wrote there.

A report reads like the JSON it wrote (``report["selected_layer"]``, ``report.get(...)``, ``dict(report)``), and
:func:`dihal_fast.common.io.atomic_write_json` writes one (nested in other data too) as that JSON. Here, below
every package, so that the DiHAL stages (:mod:`dihal_fast.pipeline.reports`), HC-DLM training and backbone
training return the same type.
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

    def to_dict(self) -> dict[str, Any]:
        """The report as the plain dict it was written from (a copy, for ``json.dump`` and editing)."""
        return dict(self.data)
