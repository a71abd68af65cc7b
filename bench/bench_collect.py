"""How much does streaming collection cost? Peak memory against the number of tokens, and throughput
against the bare forward pass on the same batches.

1. Memory: two fresh processes collect N and 10 N tokens with the same reservoir; each reports its
   peak RSS (ru_maxrss) after the model is loaded and after collection. Target: ratio <= 1.2.
2. Throughput: on the same pre-tokenised batches, (a) the bare forward ``model(input_ids)`` (LM
   head included), (b) the backbone with ``output_hidden_states`` (no LM head) and (c) one
   collection step (b + covariance + reservoir for every hidden state). Medians of interleaved
   rounds. Target: (c) / (a) - 1 <= 15 %.

Uses the shipped backbone when present, otherwise a random Llama of its architecture built here.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report, rows_figure, table, target  # noqa: E402


def _model_dir(work: Path) -> tuple[str, str]:
    """The shipped backbone, or a random Llama of its architecture (dihal_fast/backbone/config.py defaults)."""
    from dihal_fast.backbone import DEFAULT_MODEL_DIR

    if (DEFAULT_MODEL_DIR / "config.json").is_file():
        return str(DEFAULT_MODEL_DIR), "shipped backbone"
    path = work / "llama-8x256-v4096"
    if not (path / "config.json").is_file():
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        from dihal_fast.testing import make_tiny_tokenizer

        tokenizer = make_tiny_tokenizer()
        config = LlamaConfig(
            vocab_size=4096,
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=8,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=512,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return str(path), "random Llama of the shipped backbone's architecture (8 layers, D 256, FFN 688, vocab 4096)"


def _corpus() -> str:
    shared = Path(__file__).resolve().parents[2] / "shared" / "data" / "text" / "gutenberg_nltk.train.txt"
    if shared.is_file():
        return str(shared)
    from dihal_fast.backbone import default_corpus

    return str(default_corpus())


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child_memory(args: argparse.Namespace) -> None:
    """Collect ``--tokens`` tokens in this fresh process and print peak RSS figures as JSON."""
    from dihal_fast.collect import CollectConfig, collect
    from dihal_fast.common.hf_loading import load_causal_lm

    load_causal_lm(args.model)  # the model's own footprint, to separate it from the collection's
    after_model = _max_rss_mb()
    config = CollectConfig(
        model=args.model,
        corpus=[args.corpus],
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        max_tokens=args.tokens,
        reservoir_size=args.reservoir,
        checkpoint_every=10**9,
    )
    with tempfile.TemporaryDirectory() as run:
        start = time.perf_counter()
        result = collect(config, run, progress=False)
        seconds = time.perf_counter() - start
    print(
        json.dumps(
            {"tokens": result.n_tokens, "rss_model_mb": after_model, "rss_peak_mb": _max_rss_mb(), "seconds": seconds}
        )
    )


def memory(args: argparse.Namespace, model: str, corpus: str) -> list[dict]:
    rows = []
    for tokens in (args.tokens, 10 * args.tokens):
        cmd = [
            sys.executable,
            __file__,
            "--child-memory",
            "--model",
            model,
            "--corpus",
            corpus,
            "--tokens",
            str(tokens),
            "--reservoir",
            str(args.reservoir),
            "--seq-len",
            str(args.seq_len),
            "--batch-size",
            str(args.batch_size),
        ]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    return rows


def throughput(args: argparse.Namespace, model_dir: str, corpus: str) -> dict[str, float]:
    import torch

    from dihal_fast.collect import LayerStatistics, model_hidden_states, token_mask
    from dihal_fast.common.hf_loading import load_causal_lm
    from dihal_fast.corpus import read_texts, token_blocks

    model, tokenizer = load_causal_lm(model_dir)
    blocks = token_blocks(tokenizer, read_texts([corpus]), args.seq_len, args.seq_len * args.batch_size * args.batches)
    batches = list(blocks.split(args.batch_size))
    attention = torch.ones_like(batches[0])
    mask = token_mask(attention, keep_first=False)
    n_states = model.config.num_hidden_layers + 1
    stats = LayerStatistics(range(n_states), model.config.hidden_size, args.reservoir)

    def bare():
        with torch.no_grad():
            for ids in batches:
                model(input_ids=ids)

    def hidden():
        for ids in batches:
            model_hidden_states(model.base_model, ids, attention)

    def collect_step():
        for i, ids in enumerate(batches):
            positions = (i * args.batch_size + torch.arange(ids.shape[0]))[:, None] * args.seq_len + torch.arange(
                args.seq_len
            )
            stats.update(model_hidden_states(model.base_model, ids, attention), mask, positions, ids)

    runs = {
        "bare forward (model(input_ids))": bare,
        "backbone + output_hidden_states": hidden,
        "collection step": collect_step,
    }
    for fn in runs.values():  # warm-up (the reservoir fills here, as in a long run)
        fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    tokens = len(batches) * args.batch_size * args.seq_len
    return {name: tokens / float(np.median(t)) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=20_000, help="N for the memory test (the second run uses 10 N)")
    parser.add_argument("--reservoir", type=int, default=3000, help="reservoir size (tokens per layer)")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per block")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch and OpenMP threads (default: the libraries' own)"
    )
    parser.add_argument("--batch-size", type=int, default=8, help="blocks per forward")
    parser.add_argument("--batches", type=int, default=6, help="batches per throughput round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved throughput rounds (median reported)")
    parser.add_argument("--child-memory", action="store_true", help="internal: one memory measurement")
    parser.add_argument("--model", default=None, help="internal: model directory for --child-memory")
    parser.add_argument("--corpus", default=None, help="internal: corpus for --child-memory")
    args = parser.parse_args()
    if args.threads:  # before torch and the compiled core start their thread pools; children inherit it
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if args.child_memory:
        child_memory(args)
        return
    import torch

    work = Path(tempfile.gettempdir()) / "dihal_bench_collect"
    model, what = _model_dir(work)
    corpus = _corpus()
    mem = memory(args, model, corpus)
    rates = throughput(args, model, corpus)
    bare = rates["bare forward (model(input_ids))"]
    mem_rows = [
        [r["tokens"], r["rss_model_mb"], r["rss_peak_mb"], r["rss_peak_mb"] - r["rss_model_mb"], r["seconds"]]
        for r in mem
    ]
    rate_rows = [[name, rate, bare / rate - 1.0] for name, rate in rates.items()]
    ratio = mem[1]["rss_peak_mb"] / mem[0]["rss_peak_mb"]
    overhead = bare / rates["collection step"] - 1.0
    over_hidden = rates["backbone + output_hidden_states"] / rates["collection step"] - 1.0
    mem_header = ["tokens in statistics", "RSS after model load MB", "peak RSS MB", "collection MB", "collect s"]
    rate_header = ["pass over the same batches", "tokens/s", "time overhead vs bare forward"]
    body = "\n\n".join(
        [
            f"Model: {what} ({model}); corpus {Path(corpus).name}; seq_len {args.seq_len}, batch {args.batch_size}, "
            f"reservoir {args.reservoir} tokens per layer, float32, CPU, torch threads {torch.get_num_threads()}.",
            table(mem_header, mem_rows),
            f"Peak RSS ratio 10N / N = {ratio:.3f} (target <= 1.2).",
            table(rate_header, rate_rows),
            f"Collection overhead vs the bare forward pass: {100 * overhead:.1f} % (target <= 15 %); vs the backbone "
            f"forward that yields the hidden states (no LM head): {100 * over_hidden:.1f} %. Medians of "
            f"{args.rounds} interleaved rounds of {args.batches} batches.",
        ]
    )
    report(
        "Streaming collection: memory vs tokens, throughput vs the bare forward",
        body,
        question="collection",
        figures={
            "memory": rows_figure(mem_header, mem_rows),
            "throughput": rows_figure(rate_header, rate_rows),
            "peak_rss_ratio_10n_over_n": ratio,
            "collection_overhead": overhead,
        },
        targets=[
            target("peak RSS of 10 N tokens / N tokens <= 1.2", f"{ratio:.3f}", ratio <= 1.2),
            target(
                "collection step time overhead vs the bare forward <= 15 %", f"{100 * overhead:.1f} %", overhead <= 0.15
            ),
        ],
    )


if __name__ == "__main__":
    main()
