"""Does the default hybrid of a real model drift from its backbone on the backbone's own text, and does training on
that text help? SmolLM2-135M-Instruct at hidden state 3, the default bridge, two ``dihal replace`` runs with the
same CPU budget: the four English training texts alone, and the same texts with the backbone's own unconditional
samples as a fifth source.

The backbone's samples (``--samples`` of ``--sample-tokens`` tokens from its start-of-document token, temperature 1,
no top-k, batches of 32, one generator seeded by ``--seed``) are split into training samples and held-out samples
(the last ``--heldout``). Each source gives an equal share of the training tokens (``--max-train-tokens`` = the
sources x the training samples' tokens), so both runs read the four texts alike. Each hybrid is scored by ``dihal
evaluate`` on the held-out samples (teacher-forced KL and PPL on their last blocks; Gen PPL of 64 unconditional
samples with its bootstrap interval, the backbone as evaluator) beside its validation KL on the texts.

    python bench/bench_real_samples.py --corpus ../shared/data/text/*.train.txt --val-corpus VALID_DIR \\
        --work /work/runs/selfdistill --samples-dir /work/exp/selfdistill [--model SmolLM2-135M-Instruct.Q4_1.gguf]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from _common import add_model_option, dihal_one_thread, real_model, report, rows_figure, table, target

BATCH = 32


@torch.no_grad()
def generate_samples(model: Path, out: Path, count: int, tokens: int, seed: int) -> None:
    """``count`` unconditional samples of the backbone as JSONL (one ``text`` per line), written once."""
    from dihal_fast.common.hf_loading import load_causal_lm
    from dihal_fast.corpus import token_convention

    torch.manual_seed(seed)
    backbone, tokenizer = load_causal_lm(model, "float32")
    start = list(token_convention(tokenizer).start) or [tokenizer.eos_token_id]
    lines = []
    for first in range(0, count, BATCH):
        prompt = torch.tensor([start] * min(BATCH, count - first))
        ids = backbone.eval().generate(
            prompt, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=tokens,
            eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
        lines += [json.dumps({"text": tokenizer.decode(row, skip_special_tokens=True)}) for row in ids[:, len(start) :]]
    out.write_text("\n".join(lines) + "\n")


def replace_and_evaluate(name: str, corpus: list[Path], tokens: int, heldout: Path, args: argparse.Namespace) -> dict:
    """The replace run ``name`` (reused when finished, resumed when killed) and its evaluation on the held-out
    samples; ``{result, evaluation}``."""
    out = args.work / name
    if not (out / "result.json").is_file():
        dihal_one_thread(
            "replace", "--model", str(args.model), "--layer", "3", "--val-corpus", str(args.val_corpus),
            "--max-minutes", f"{args.minutes:g}", "--budget-clock", "cpu", "--checkpoint-every", "25",
            "--corpus", *map(str, corpus), "--max-train-tokens", str(tokens), "--out", str(out),
            *(["--resume"] if (out / "checkpoints").is_dir() else []),
        )  # fmt: skip
    evaluation = args.work / f"{name}_eval"
    if not (evaluation / "evaluate.json").is_file():
        dihal_one_thread(
            "evaluate", "--hybrid", str(out), "--corpus", str(heldout), "--n-samples", "64", "--out", str(evaluation)
        )
    return {
        "result": json.loads((out / "result.json").read_text()),
        "evaluation": json.loads((evaluation / "evaluate.json").read_text()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, nargs="+", required=True, help="the English training texts")
    parser.add_argument("--val-corpus", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True, help="run directories and the model cache")
    add_model_option(parser)
    parser.add_argument("--samples-dir", type=Path, default=None, help="the generated samples (default: WORK)")
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--heldout", type=int, default=64)
    parser.add_argument("--sample-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=15.0, help="CPU minutes of each replace run")
    parser.add_argument("--question", default="real_samples_smollm2")
    args = parser.parse_args()
    args.model = real_model(args)
    folder = args.samples_dir or args.work
    folder.mkdir(parents=True, exist_ok=True)
    every = folder / f"samples{args.samples}_seed{args.seed}.jsonl"
    if not every.is_file():
        generate_samples(args.model, every, args.samples, args.sample_tokens, args.seed)
    lines = every.read_text().splitlines()
    trained = len(lines) - args.heldout
    train, heldout = folder / f"train{trained}.jsonl", folder / f"heldout{args.heldout}.jsonl"
    for path, part in ((train, lines[:trained]), (heldout, lines[trained:])):
        if not path.is_file():
            path.write_text("\n".join(part) + "\n")
        elif path.read_text().splitlines() != part:
            raise SystemExit(f"{path} holds other samples than {every}: remove it or choose another --samples-dir")
    share = trained * args.sample_tokens  # tokens per source: about all of the training samples
    runs = {
        "texts": replace_and_evaluate("text_only", args.corpus, len(args.corpus) * share, heldout, args),
        "texts + backbone samples": replace_and_evaluate(
            "with_samples", [train, *args.corpus], (len(args.corpus) + 1) * share, heldout, args
        ),
    }
    columns = [
        "training data", "steps", "tokens", "val PPL ratio", "val KL", "KL on backbone samples",
        "PPL on backbone samples (backbone)", "Gen PPL [95 %]", "backbone Gen PPL [95 %]",
    ]  # fmt: skip
    rows = []
    for name, run in runs.items():
        validation, evaluation = run["result"]["validation"], run["evaluation"]
        hybrid, backbone = evaluation["hybrid"], evaluation["backbone"]
        interval = hybrid["gen_ppl_details"]["gen_ppl_interval"]
        reference = backbone["gen_ppl_details"]["gen_ppl_interval"]
        rows.append([
            name, run["result"]["steps_trained"], run["result"]["tokens_seen"], validation["ppl_ratio"],
            validation["kl"], hybrid["kl"], f"{hybrid['ppl']:.1f} ({backbone['ppl']:.1f})",
            f"{hybrid['gen_ppl']:.1f} [{interval[0]:.1f}, {interval[1]:.1f}]",
            f"{backbone['gen_ppl']:.1f} [{reference[0]:.1f}, {reference[1]:.1f}]",
        ])  # fmt: skip
    plain, mixed = (runs[k]["evaluation"]["hybrid"] for k in runs)
    backbone_interval = runs["texts"]["evaluation"]["backbone"]["gen_ppl_details"]["gen_ppl_interval"]
    report(
        f"The default SmolLM2-135M hybrid on its backbone's own samples, {args.minutes:g} CPU-minutes per run",
        table(columns, rows),
        question=args.question,
        figures={"runs": rows_figure(columns, rows), "training_samples": trained, "heldout_samples": args.heldout},
        targets=[
            target(
                "training on the backbone's samples lowers the KL on held-out samples",
                f"{plain['kl']:.3f} -> {mixed['kl']:.3f}",
                mixed["kl"] < plain["kl"],
            ),
            target(
                "Gen PPL interval overlaps the backbone's (texts + samples)",
                f"{mixed['gen_ppl']:.1f} vs {runs['texts']['evaluation']['backbone']['gen_ppl']:.1f}",
                mixed["gen_ppl_details"]["gen_ppl_interval"][0] <= backbone_interval[1],
            ),
        ],
    )


if __name__ == "__main__":
    main()
