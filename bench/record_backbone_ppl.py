"""The record of a shipped backbone's held-out perplexities, read from the training report in its asset folder.

``dihal backbone train`` writes ``training_report.json`` (per held-out split the backbone's PPL and the unigram /
bigram baselines on the same tokens) next to the weights it ships; this turns that report, and the run's
``training_log.jsonl`` (the ``--steps`` changes of a resumed run), into the record ``bench/results/<question>.json``
with the training command and date of the run itself, so the README's backbone table traces to a record.

    python bench/record_backbone_ppl.py --model tiny-qwen3-16l --question backbone_perplexity_qwen3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import NOT_RECORDED, REPO, rows_figure, table, write_record  # noqa: E402

COLUMNS = ["held-out split", "tokens", "backbone PPL", "unigram PPL", "bigram PPL (k)", "backbone / bigram"]


def backbone_record(model_dir: Path, name: str, question: str) -> dict:
    """The record of the backbone in ``model_dir`` (a ``dihal backbone train`` run or its shipped copy)."""
    from dihal_fast.common import read_json

    report = read_json(model_dir / "training_report.json", "backbone training report")
    log = model_dir / "training_log.jsonl"
    events = [json.loads(line) for line in (log.read_text().splitlines() if log.is_file() else []) if '"event"' in line]
    rows = [
        [
            split,
            row["tokens"],
            round(row["ppl"], 2),
            round(row["unigram_ppl"], 1),
            f"{row['bigram_ppl']:.1f} ({row['bigram_k']})",
            round(row["ppl"] / row["bigram_ppl"], 2),
        ]
        for split, row in report["validation"].items()
    ]
    model = report["model"]
    heads = (
        f"{model['num_heads']} heads ({model['num_kv_heads'] or model['num_heads']} key/value) of {model['head_dim']}"
    )
    minutes = report["wall_time_s"] / 60
    history = "; ".join(f"at step {e['step']}: {e['event']}" for e in events)
    body = (
        f"{report['architecture']}, {model['num_layers']} layers, hidden {model['hidden_size']}, {heads}, SwiGLU "
        f"{model['intermediate_size']}, vocab {model['vocab_size']} (byte-level BPE), context {model['seq_len']}, "
        f"{'tied' if model['tie_embeddings'] else 'untied'} head: {report['parameters']:,} parameters, "
        f"{report['checkpoint_bytes'] / 1e6:.1f} MB safetensors ({report['precision']}). "
        f"{report['steps_completed']} steps ({report['train_tokens_seen'] / 1e6:.2f} M tokens), {minutes:.1f} min of "
        f"training wall time, seed {report['seed']}"
        + (f" (resumed runs re-plan the cosine from their checkpoint; {history})" if history else "")
        + ". Held-out splits = the `*.valid.txt` files (never trained on), scored as for the first backbone (unigram "
        "add-1, bigram add-k with k picked on the scored tokens).\n\n"
        + table(COLUMNS, [[r[0], f"{r[1]:,}", f"{r[2]:.2f}", f"{r[3]:.1f}", r[4], f"{r[5]:.2f}"] for r in rows])
        + f"\n\nFigures from `{_shown(model_dir)}/training_report.json`, written by the training run itself."
    )
    software = report.get("software", {})
    return {
        "question": question,
        "title": f"Shipped backbone {name}: validation perplexity vs baselines",
        "command": report["command"] or NOT_RECORDED,
        "commit": NOT_RECORDED,
        "machine": f"{software.get('machine', 'unknown')} (CPU not recorded), torch {software.get('torch', '?')}",
        "date": report["created"][:16].replace("T", " "),
        "body": body,
        "targets": [],
        "figures": {
            "validation_ppl": rows_figure(COLUMNS, rows),
            "parameters": report["parameters"],
            "steps": report["steps_completed"],
            "train_tokens": report["train_tokens_seen"],
            "training_minutes": round(minutes, 1),
        },
    }


def _shown(path: Path) -> str:
    """``path`` relative to the repository when inside it (the shipped assets), else as given."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def main() -> None:
    from dihal_fast.common.hf_loading import resolve_model_dir

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-qwen3-16l", help="shipped backbone name or backbone run directory")
    parser.add_argument("--question", default="backbone_perplexity_qwen3", help="record key (file name)")
    args = parser.parse_args()
    path = write_record(backbone_record(resolve_model_dir(args.model), Path(args.model).name, args.question))
    print(f"record: {path}  (re-render bench/README.md: python bench/render_results.py)")


if __name__ == "__main__":
    main()
