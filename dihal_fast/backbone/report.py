"""Training report (per-split validation PPL next to unigram / bigram baselines), curve plot, ``info`` text."""

from __future__ import annotations

import datetime
import io
import json
import logging
import platform
from pathlib import Path
from typing import Any

import numpy as np

from dihal_fast.backbone.baselines import best_bigram_perplexity, unigram_perplexity
from dihal_fast.backbone.perplexity import stream_nll
from dihal_fast.common import atomic_write_bytes, atomic_write_json, read_json
from dihal_fast.common.metrics import perplexity, pooled_nll

logger = logging.getLogger(__name__)

REPORT_NAME = "training_report.json"


def validation_table(
    model, train_ids: np.ndarray, valid_ids: dict[str, np.ndarray], seq_len: int, precision: str
) -> dict:
    """Per held-out split: model PPL (full split), unigram (add-1) and best add-k bigram PPL on the same tokens."""
    from dihal_fast.common.progress import progress_bar

    vocab = model.config.vocab_size
    table = {}
    for name, ids in progress_bar(valid_ids.items(), desc="validation", unit="split", leave=False):
        nll, count = stream_nll(model, ids, seq_len, precision=precision)
        bigram, k = best_bigram_perplexity(train_ids, ids, vocab)
        table[name] = {
            "tokens": count,
            "ppl": perplexity(pooled_nll(nll, count)),
            "unigram_ppl": unigram_perplexity(train_ids, ids, vocab),
            "bigram_ppl": bigram,
            "bigram_k": k,
        }
        logger.info(
            "%s: PPL %.2f (unigram %.1f, bigram %.1f)", name, table[name]["ppl"], table[name]["unigram_ppl"], bigram
        )
    return table


def write_training_report(
    out: Path,
    model,
    tokenizer,
    cfg,
    corpus,
    train_ids,
    valid_ids,
    step: int,
    wall_s: float,
    precision: str,
    command: str,
) -> dict[str, Any]:
    """Evaluate, plot the curve and write ``training_report.json`` in ``out``; returns the report."""
    import torch
    import transformers

    from dihal_fast import __version__
    from dihal_fast.backbone.model import ARCHITECTURES, count_parameters

    report = {
        "command": command,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "steps_completed": step,
        "steps_planned": cfg.steps,
        "seed": cfg.seed,
        "precision": precision,
        "wall_time_s": round(wall_s, 1),
        "train_tokens_seen": step * cfg.batch_size * cfg.grad_accum_steps * cfg.model.seq_len,
        "architecture": ARCHITECTURES[cfg.model.family],
        "parameters": count_parameters(model),
        "model": cfg.to_dict()["model"],
        "tokenizer": {"type": "byte-level BPE", "vocab_size": len(tokenizer)},
        "checkpoint_bytes": (out / "model.safetensors").stat().st_size,
        "data": {
            "files": corpus.files,
            "train_tokens": int(len(train_ids)),
            "valid_tokens": {k: int(len(v)) for k, v in valid_ids.items()},
        },
        "validation": validation_table(model, train_ids, valid_ids, cfg.model.seq_len, precision),
        "software": {
            "dihal_fast": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(),
        },
        "train_config": cfg.to_dict(),
    }
    atomic_write_json(out / REPORT_NAME, report)
    plot_training_curve(out / "log.jsonl", out / "training_curve.png")
    return report


def plot_training_curve(log_path: Path, png_path: Path) -> None:
    """Train loss and per-split validation loss (nats/token) against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in Path(log_path).read_text().splitlines() if line.strip()]
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="train (batch)", color="0.6", lw=1)
    splits = sorted({name for r in records for name in r.get("val_loss", {})})
    for name in splits:
        points = [(r["step"], r["val_loss"][name]) for r in records if name in r.get("val_loss", {})]
        ax.plot(*zip(*points), marker="o", ms=3, label=f"valid: {name}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title("backbone training")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(png_path, buffer.getvalue())


def describe_backbone(model_dir: str | Path) -> str:
    """Human-readable summary of a backbone directory: architecture, size, data, validation PPL."""
    from transformers import AutoConfig

    from dihal_fast.common.assets import SHIPPED_BACKBONES

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"no checkpoint at {model_dir} (expected a directory with config.json, model weights, tokenizer)"
        )
    config = AutoConfig.from_pretrained(str(model_dir))
    shipped = [b.name for b in SHIPPED_BACKBONES.values() if b.directory.resolve() == model_dir.resolve()]
    lines = [
        f"backbone: {model_dir}" + (f" (shipped as {shipped[0]})" if shipped else ""),
        *_gguf_lines(model_dir),
        (
            f"architecture: {', '.join(config.architectures or [config.model_type])} "
            f"({config.num_hidden_layers} layers, hidden {config.hidden_size}, {config.num_attention_heads} heads"
            f"{_kv_heads(config)}, "
            f"intermediate {config.intermediate_size}, vocab {config.vocab_size}, context "
            f"{config.max_position_embeddings}, "
            f"tied embeddings {config.tie_word_embeddings})"
        ),
    ]
    report_path = model_dir / REPORT_NAME
    if not report_path.is_file():
        lines.append(f"no {REPORT_NAME} next to the checkpoint: training data and validation perplexity unknown")
        return "\n".join(lines)
    report = read_json(report_path, "training report")
    lines.append(f"parameters: {report['parameters']:,} ({report['checkpoint_bytes'] / 2**20:.1f} MiB safetensors)")
    lines.append(
        f"trained: {report['steps_completed']}/{report['steps_planned']} steps, "
        f"{report['train_tokens_seen']:,} tokens seen, seed {report['seed']}, {report['precision']}, "
        f"{report['wall_time_s'] / 60:.1f} min"
    )
    lines.append(f"command: {report['command']}")
    lines.append("data:")
    for item in report["data"]["files"]:
        lines.append(
            f"  {item['role']:<6} {Path(item['path']).name} ({item['bytes']:,} bytes, sha256 {item['sha256'][:12]})"
        )
    lines.append(f"{'held-out split':<20}{'tokens':>9}{'PPL':>9}{'unigram':>9}{'bigram':>9}")
    for name, row in report["validation"].items():
        lines.append(
            f"{name:<20}{row['tokens']:>9}{row['ppl']:>9.2f}{row['unigram_ppl']:>9.1f}{row['bigram_ppl']:>9.1f}"
        )
    return "\n".join(lines)


def _gguf_lines(model_dir: Path) -> list[str]:
    """What ``dihal backbone info`` says of the GGUF file a view directory stands for (nothing for another)."""
    from dihal_fast.common.hf_loading import gguf_source

    source = gguf_source(model_dir)
    if source is None:
        return []
    types = ", ".join(f"{name} x{count}" for name, count in source["tensor_types"].items())
    return [
        f"GGUF file: {source['file']} ({source['bytes'] / 2**20:.1f} MiB, sha256 {source['sha256']})",
        f"GGUF tensors: {types}; dequantized at load (--dtype auto: {source['dtype']})",
    ]


def _kv_heads(config) -> str:
    """`` (2 key/value of 32)`` for grouped-query attention, else nothing."""
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return f" ({kv} key/value) of {head_dim}" if kv != config.num_attention_heads else f" of {head_dim}"


def pooled_validation_ppl(report: dict[str, Any]) -> float | None:
    """Token-pooled perplexity over every held-out split of a training report (None when it has none)."""
    rows = list((report.get("validation") or {}).values())
    tokens = sum(row["tokens"] for row in rows)
    if not tokens:
        return None
    return float(np.exp(sum(row["tokens"] * np.log(row["ppl"]) for row in rows) / tokens))


def shipped_backbone_rows() -> list[dict[str, Any]]:
    """One row per shipped backbone: name, family, layers, width, parameters, held-out PPL (pooled and per
    split), directory, description; ``available`` is False (and the shape fields None) when its files are absent."""
    from dihal_fast.common.assets import SHIPPED_BACKBONES

    rows = []
    for entry in SHIPPED_BACKBONES.values():
        row: dict[str, Any] = {
            "name": entry.name,
            "family": entry.family,
            "layers": None,
            "hidden_size": None,
            "parameters": None,
            "heldout_ppl": None,
            "heldout_ppl_by_split": None,
            "directory": str(entry.directory),
            "description": entry.description,
            "available": (entry.directory / "config.json").is_file(),
        }
        if row["available"]:
            config = read_json(entry.directory / "config.json", "model config")
            row.update(layers=config["num_hidden_layers"], hidden_size=config["hidden_size"])
            if (entry.directory / REPORT_NAME).is_file():
                report = read_json(entry.directory / REPORT_NAME, "training report")
                row.update(
                    parameters=report["parameters"],
                    heldout_ppl=pooled_validation_ppl(report),
                    heldout_ppl_by_split={k: v["ppl"] for k, v in report["validation"].items()},
                )
        rows.append(row)
    return rows


def format_backbone_rows(rows: list[dict[str, Any]]) -> str:
    """The ``dihal backbone list`` table."""
    lines = [f"{'name':<16}{'family':<8}{'layers':>7}{'width':>7}{'parameters':>12}{'held-out PPL':>14}  directory"]
    for row in rows:
        if not row["available"]:
            lines.append(f"{row['name']:<16}{row['family']:<8}  (not installed: no config.json in {row['directory']})")
            continue
        params = f"{row['parameters']:,}" if row["parameters"] else "?"
        ppl = f"{row['heldout_ppl']:.2f}" if row["heldout_ppl"] else "?"
        lines.append(
            f"{row['name']:<16}{row['family']:<8}{row['layers']:>7}{row['hidden_size']:>7}{params:>12}{ppl:>14}  "
            f"{row['directory']}"
        )
    lines.append(
        "held-out PPL: token-pooled over the four *.valid.txt splits of the training report (dihal backbone info "
        "--model NAME)"
    )
    return "\n".join(lines)
