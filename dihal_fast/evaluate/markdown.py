"""``report.md`` of the end-to-end run: tables of every metric, the plots inline, samples."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from dihal_fast.common import atomic_write_bytes

METRICS = ("nll", "ppl", "kl", "gen_ppl", "entropy", "diversity_dihal", "diversity_ld4lg", "tokens_per_s")


def metric_cell(column: Mapping, metric: str) -> str:
    """One model's value of ``metric``; Gen PPL with its bootstrap interval over the samples."""
    interval = column.get(f"{metric}_interval")
    value = format_value(column.get(metric))
    return value if not interval else f"{value} [{format_value(interval[0])}, {format_value(interval[1])}]"


def format_value(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _mean_std(cell: Mapping | None) -> str:
    if not cell:
        return "n/a"
    std = cell.get("std")
    return format_value(cell.get("mean")) + ("" if std is None else f" ± {format_value(std)}")


def table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A GitHub-flavoured markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(format_value(c) if not isinstance(c, str) else c for c in row) + " |" for row in rows]
    return "\n".join(lines)


def metrics_table(evaluation: Mapping) -> str:
    """Metric rows, one column per evaluated model (backbone, hybrid, controls)."""
    columns = {"backbone": evaluation["backbone"], "hybrid": evaluation["hybrid"], **evaluation.get("controls", {})}
    header = ["metric", *columns]
    out = table(header, [[m, *(metric_cell(col, m) for col in columns.values())] for m in METRICS])
    notes = [
        f"- {name}, {metric}: {why}"
        for name, col in columns.items()
        for metric, why in (col.get("notes") or {}).items()
    ]
    if any(col.get("likelihood_note") for col in columns.values()):
        notes += [
            f"- {name}, nll/ppl/kl: {col['likelihood_note']}"
            for name, col in columns.items()
            if col.get("likelihood_note")
        ]
    return out + ("\n\nn/a explained:\n\n" + "\n".join(notes) if notes else "")


def downstream_table(evaluation: Mapping) -> str:
    """The ``downstream`` section of an evaluation (``dihal evaluate --tasks``): one row per task and metric,
    ``value ± stderr`` per model; empty when no task was run."""
    downstream = evaluation.get("downstream")
    if not downstream:
        return ""
    results = downstream["results"]
    rows = []
    for task in downstream["tasks"]:
        first = next(iter(results.values()))[task]
        for metric in (key for key in first if not key.endswith("_stderr") and key not in ("n", "version")):
            cells = []
            for model in results.values():
                stderr = model[task].get(f"{metric}_stderr")
                cells.append(
                    format_value(model[task][metric]) + ("" if stderr is None else f" ± {format_value(stderr)}")
                )
            rows.append([task, metric, *cells])
    limit = "" if downstream.get("limit") is None else f", first {downstream['limit']} examples per task"
    return table(["task", "metric", *results], rows) + f"\n\n(lm-eval {downstream['lm_eval_version']}{limit})"


def locate_table(locate: Mapping) -> str:
    rows = [
        [
            r["layer"],
            _mean_std(r.get("m_curv")),
            _mean_std(r.get("m_mono")),
            _mean_std(r.get("k_eff")),
            _mean_std(r.get("score")) + (" **selected**" if r["layer"] == locate["selected_layer"] else ""),
        ]
        for r in locate["layers"]
    ]
    return table(["layer", "m_curv", "m_mono", "k_eff", "score"], rows)


def targets(evaluation: Mapping) -> dict:
    """The issue's targets that one run can check: PPL ratio (<= 1.25) and throughput ratio."""
    ratio = evaluation["hybrid"]["ppl"] / evaluation["backbone"]["ppl"]
    speed = evaluation["hybrid"]["tokens_per_s"] / evaluation["backbone"]["tokens_per_s"]
    return {
        "ppl_ratio": ratio,
        "ppl_ratio_target": 1.25,
        "ppl_ratio_met": ratio <= 1.25,
        "tokens_per_s_ratio": speed,
        "tokens_per_s_ratio_note": "hybrid / backbone; > 1 means the hybrid is faster",
    }


def write_report(path: Path, title: str, sections: Sequence[tuple[str, str]]) -> Path:
    """Write ``# title`` followed by ``## heading`` + body for each section, atomically."""
    parts = [f"# {title}\n"] + [f"## {heading}\n\n{body.strip()}\n" for heading, body in sections]
    return atomic_write_bytes(path, "\n".join(parts).encode())


def samples_block(samples: Mapping[str, Sequence[str]], per_model: int = 3, width: int = 300) -> str:
    """The first few samples of every model, each cut to ``width`` characters."""
    out = []
    for name, texts in samples.items():
        out.append(f"**{name}**\n")
        for text in texts[:per_model]:
            clean = " ".join(text.split())[:width] or "_(empty after decoding: only special tokens)_"
            out.append(f"> {clean}\n")
    return "\n".join(out)


def image(path: Path, relative_to: Path, caption: str) -> str:
    """Inline markdown image if the plot exists, else a note saying it is missing."""
    if not path.is_file():
        return f"_({caption}: plot not produced)_"
    return f"![{caption}]({path.relative_to(relative_to).as_posix()})"
