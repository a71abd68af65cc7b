"""Where does a real-model hybrid differ from its backbone, in text it copies from or in text it must invent, and
does it copy more once it runs on its own samples? SmolLM2-135M-Instruct hybrids against their backbone.

Every hybrid of ``--hybrid LABEL=DIR`` and the backbone score the same token sequences teacher-forced: the held-out
English blocks ``dihal evaluate`` scores (the last 32 blocks of 128 tokens of ``--val-corpus``) and the 64 samples of
each model in every ``dihal evaluate`` report of ``--samples`` (the backbone's and that report's hybrid's, retokenised,
from the start-of-document token). A position is a *copy position* when its two preceding tokens occurred before in
the sequence; the token that followed their latest earlier occurrence is the copy candidate (what an induction head
predicts). Per text and model: the mean probability of the copy candidate, KL(backbone || model) at copy and other
positions, and the model's minus the backbone's copy-candidate probability with a 95 % bootstrap interval over
sequences (2,000 draws). A model that loops more than its backbone in free-running samples without giving the copy
candidate more probability in the backbone's text would show here as a difference only in its own samples.

    python bench/bench_real_repetition.py --val-corpus VALID_DIR --model SmolLM2-135M-Instruct.Q4_1.gguf \\
        --hybrid "default, 30 min=RUN/hybrid" --samples RUN_eval_t0.7_p0.9/evaluate.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import nvtx
import torch
from _common import add_model_option, real_model, report, rows_figure, table
from transformers import AutoModelForCausalLM

from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.corpus.convention import token_convention
from dihal_fast.evaluate.harness import EvalProtocolConfig, heldout_blocks
from dihal_fast.evaluate.scoring import INTERVAL_DRAWS

MIN_TOKENS = 8  # a retokenised sample shorter than this holds no copy position worth scoring


def hybrid_option(text: str) -> tuple[str, Path]:
    """``"LABEL=DIR"`` -> (LABEL, DIR), checked before any work: DIR must be a checkpoint directory."""
    label, sep, path = text.partition("=")
    if not sep or not label or not (Path(path) / "config.json").is_file():
        raise SystemExit(f"--hybrid {text!r}: expected LABEL=DIR with DIR a hybrid checkpoint (its config.json)")
    return label, Path(path)


def copy_candidates(sequence: list[int]) -> list[int]:
    """Per position t, the token that followed the latest earlier occurrence of ``(x[t-2], x[t-1])``, or -1."""
    candidates, seen = [-1] * len(sequence), {}
    for t in range(2, len(sequence)):
        key = (sequence[t - 2], sequence[t - 1])
        if key in seen:
            candidates[t] = sequence[seen[key]]
        seen[key] = t
    return candidates


@nvtx.annotate("score_sequences")
@torch.no_grad()
def position_stats(models: dict[str, torch.nn.Module], sequences: list[list[int]]) -> dict[str, list[dict]]:
    """Per model and sequence: the copy candidate's probability at each copy position, and KL(backbone || model)
    at copy and at other positions (float64 log-softmax)."""
    stats: dict[str, list[dict]] = {name: [] for name in models}
    for sequence in sequences:
        ids = torch.tensor([sequence])
        log_probs = {name: torch.log_softmax(m(ids).logits[0, :-1].double(), -1) for name, m in models.items()}
        candidates = torch.tensor(copy_candidates(sequence)[1:])
        copy = candidates >= 0
        rows = torch.arange(len(sequence) - 1)[copy]
        teacher = log_probs["backbone"]
        for name, log_p in log_probs.items():
            kl = (teacher.exp() * (teacher - log_p)).sum(-1)
            stats[name].append({
                "p_copy": log_p[rows, candidates[copy]].exp().numpy(),
                "kl_copy": kl[copy].numpy(),
                "kl_other": kl[~copy].numpy(),
            })  # fmt: skip
    return stats


def difference_interval(own: list[dict], base: list[dict], seed: int = 0) -> tuple[float, float, float]:
    """Mean copy-candidate probability of ``own`` minus ``base`` over all copy positions, with a 95 % bootstrap
    interval over sequences (the positions of one sequence move together)."""
    sums = np.array([(o["p_copy"] - b["p_copy"]).sum() for o, b in zip(own, base)])
    counts = np.array([o["p_copy"].size for o in own])
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(INTERVAL_DRAWS):
        pick = rng.integers(0, len(sums), len(sums))
        draws.append(sums[pick].sum() / max(counts[pick].sum(), 1))
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(sums.sum() / counts.sum()), float(low), float(high)


def pooled(stats: list[dict], key: str) -> float:
    values = np.concatenate([s[key] for s in stats])
    return float(values.mean()) if values.size else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_option(parser)
    parser.add_argument("--work", type=Path, required=True, help="the model cache when --model is not given")
    parser.add_argument("--val-corpus", type=Path, required=True, help="the held-out text dihal evaluate read")
    parser.add_argument("--hybrid", action="append", required=True, metavar="LABEL=DIR", help="repeatable")
    parser.add_argument("--samples", action="append", default=[], type=Path, metavar="EVALUATE_JSON", help="repeatable")
    parser.add_argument("--question", default="real_repetition_smollm2")
    args = parser.parse_args()
    hybrids = [hybrid_option(text) for text in args.hybrid]
    for path in args.samples:
        if not path.is_file():
            raise SystemExit(f"--samples {path}: no such dihal evaluate report")
    torch.set_num_threads(1)
    backbone, tokenizer = load_causal_lm(real_model(args))
    models = {  # each hybrid as a user loads it: its own remote code from the directory
        "backbone": backbone,
        **{label: AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval() for label, path in hybrids},
    }
    convention = token_convention(tokenizer)
    texts = {"held-out text": heldout_blocks(tokenizer, args.val_corpus, EvalProtocolConfig()).blocks.tolist()}
    seen: set[tuple[str, ...]] = set()
    for path in args.samples:
        report_json = json.loads(path.read_text())
        settings = report_json["settings"]
        setting = f"T {settings['temperature']:g} / top-p {settings['top_p']:g}"
        for kind in ("backbone", "hybrid"):
            if tuple(report_json["samples"][kind]) in seen:  # the backbone's samples recur in every report
                continue
            seen.add(tuple(report_json["samples"][kind]))
            encoded = [list(convention.start) + convention.encode(text) for text in report_json["samples"][kind]]
            texts[f"{kind} samples, {setting} ({path.parent.name})"] = [s for s in encoded if len(s) >= MIN_TOKENS]
    columns = [
        "text", "model", "copy positions", "p(copy candidate)", "model - backbone [95 %]", "KL at copy positions",
        "KL elsewhere",
    ]  # fmt: skip
    rows = []
    for text, sequences in texts.items():
        stats = position_stats(models, sequences)
        copies = sum(s["p_copy"].size for s in stats["backbone"])
        for name in models:
            gap = (
                ""
                if name == "backbone"
                else "{:+.4f} [{:+.4f}, {:+.4f}]".format(*difference_interval(stats[name], stats["backbone"]))
            )
            rows.append([
                text, name, copies, round(pooled(stats[name], "p_copy"), 4), gap,
                round(pooled(stats[name], "kl_copy"), 4), round(pooled(stats[name], "kl_other"), 4),
            ])  # fmt: skip
    body = table(columns, rows) + (
        "\n\nCopy position: the two preceding tokens occurred before in the sequence; copy candidate: the token that "
        "followed their latest earlier occurrence. Interval: bootstrap over sequences (2,000 draws)."
    )
    report(
        "Where the SmolLM2-135M hybrid differs from its backbone: copying and inventing, in held-out text and in "
        "free-running samples",
        body,
        question=args.question,
        figures={"rows": rows_figure(columns, rows), "hybrids": {label: str(path) for label, path in hybrids}},
    )


if __name__ == "__main__":
    main()
