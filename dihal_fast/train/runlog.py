"""The training log: one JSON object per line (``log.jsonl``) and a loss-curve PNG drawn from it."""

from __future__ import annotations

import io
import json
from pathlib import Path

from dihal_fast.common import atomic_write_bytes
from dihal_fast.common.io import append_line

TERMS = ("loss", "diff", "rec", "lm", "kd")


class RunLog:
    """Append-only JSONL of training records; :meth:`truncate_after` drops lines a crash left past a checkpoint."""

    def __init__(self, path: Path):
        self.path = path

    def records(self) -> list[dict]:
        if not self.path.is_file():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a crash
                continue
        return out

    def append(self, record: dict) -> None:
        append_line(self.path, json.dumps(record))

    def truncate_after(self, step: int) -> None:
        kept = [r for r in self.records() if r.get("step", 0) <= step]
        atomic_write_bytes(self.path, "".join(json.dumps(r) + "\n" for r in kept).encode())

    def plot(self, png: Path, title: str, validation: list[tuple[int, float]]) -> None:
        """Loss terms against step (log scale) and the validation bridge loss ``(step, loss)`` as points."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        records = self.records()
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for term in TERMS:
            points = [(r["step"], r[term]) for r in records if isinstance(r.get(term), (int, float)) and r[term] > 0]
            if points:
                ax.plot(*zip(*points), label=term)
        if validation:
            ax.plot(*zip(*validation), "ko", label="validation bridge loss")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title(title)
        ax.legend()
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110)
        plt.close(fig)
        atomic_write_bytes(png, buffer.getvalue())
