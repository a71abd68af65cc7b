"""What does the pipeline cost at a real model's size? The rehearsal, random weights.

Runs ``dihal locate`` (every layer), ``dihal replace`` (plain torch, then DeepSpeed ZeRO-2 and ZeRO-3 with two
CPU ranks under ``torchrun``), ``dihal evaluate`` and ``dihal generate`` as a user would, each in its own niced
process, on the random-weight checkpoints of ``bench/make_rehearsal_model.py`` (Llama-3.2-1B's and Qwen3-0.6B's
shapes, bfloat16). Per stage: wall and CPU seconds and peak RSS (``os.wait4`` of the stage's process; under
``torchrun`` the largest rank), the bytes the stage wrote, and the memory the design accounts for
(docs/DESIGN.md, "Memory at size"): the weights in their dtype, the states the stage keeps, the runtime's own
RSS (torch + transformers + dihal_fast imported, measured), and the ratio of the peak to that sum. The GEMM
rate of float32 and bfloat16 at the model's width on one thread is measured in the same run.

Each stage's figures are saved in ``RUNS/<shape>/stages.json`` as soon as it finishes; a rerun skips finished
stages (``--redo`` reruns them) and ``--report`` writes ``bench/results/rehearsal.json`` from what is there.

    python bench/make_rehearsal_model.py --out /work/runs/rehearsal/models llama-1b qwen3-0.6b
    python bench/bench_rehearsal.py --models /work/runs/rehearsal/models --runs /work/runs/rehearsal/runs \\
        --shapes qwen3-0.6b llama-1b --report
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _common import add_rehearsal_options, gemm_rates, report, rows_figure, table

STAGES = ("locate", "replace", "zero2", "zero3", "evaluate", "generate")
TEXT = Path("/work/shared/data/text")
RUNTIME = "import torch, transformers, dihal_fast.hybrid, dihal_fast.evaluate.models"


def dihal_command(dihal: str) -> list[str]:
    """The ``dihal`` entry point as a command (a script run by this Python when it is one)."""
    return [sys.executable, dihal] if Path(dihal).is_file() else [dihal]


def measured(command: list[str], log: Path, threads: int) -> dict:
    """Run ``command`` niced with ``threads`` threads per process; wall, CPU and peak RSS from ``os.wait4``."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "DIHAL_NUM_THREADS": str(threads)}
    env["DIHAL_PROGRESS"] = "plain"
    start = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(["nice", "-n", "10", *command], stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed (exit {os.waitstatus_to_exitcode(status)}); see {log}")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_gb": usage.ru_maxrss * 1024 / 1e9,
    }


def bytes_under(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def model_facts(model: Path) -> dict:
    """Layers, width, weight bytes and dtype of a checkpoint (from its files, nothing loaded)."""
    config = json.loads((model / "config.json").read_text())
    return {
        "layers": config["num_hidden_layers"],
        "hidden": config["hidden_size"],
        "intermediate": config["intermediate_size"],
        "dtype": config.get("dtype") or config.get("torch_dtype"),
        "weight_bytes": sum(p.stat().st_size for p in model.glob("*.safetensors")),
    }


def bridge_bytes(hybrid: Path) -> int:
    """Bytes of the bridge's float32 tensors in a saved hybrid."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(hybrid / "model.safetensors"), framework="pt") as handle:
        for key in handle.keys():  # noqa: SIM118
            if key.startswith("bridge."):
                t = handle.get_slice(key)
                n = 1
                for d in t.get_shape():
                    n *= d
                total += 4 * n
    return total


def stage_command(stage: str, dihal: list[str], model: Path, run: Path, args: argparse.Namespace) -> list[str]:
    """The user's command for ``stage`` of the rehearsal of ``model`` in run directory ``run``."""
    common = ["--corpus", str(args.text), "--dtype", args.dtype]
    train = ["--steps", str(args.steps), "--batch-size", str(args.batch_size), "--val-blocks", "2",
             "--stats-blocks", "2", "--eval-every", "0", "--from-locate", str(run / "locate")]  # fmt: skip
    if stage == "locate":
        return [*dihal, "locate", "--model", str(model), *common, "--max-tokens", str(args.max_tokens),
                "--batch-size", str(args.batch_size), "--sample-size", str(args.sample_size),
                "--repeats", str(args.repeats), "--out", str(run / "locate")]  # fmt: skip
    if stage == "replace":
        return [*dihal, "replace", "--model", str(model), *common, *train, "--out", str(run / "replace")]
    if stage in ("zero2", "zero3"):
        examples = Path(__file__).resolve().parents[1] / "dihal_fast" / "assets" / "examples"
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        return [*torchrun, dihal[-1], "replace", "--model", str(model), *common, *train,
                "--deepspeed", str(examples / f"ds_{stage}.json"), "--out", str(run / f"replace_{stage}")]  # fmt: skip
    if stage == "evaluate":
        return [*dihal, "evaluate", "--hybrid", str(run / "replace"), "--evaluator", str(model), *common,
                "--evaluator-dtype", args.dtype, "--seq-len", "128", "--eval-blocks", "2", "--batch-size", "2",
                "--n-samples", "2", "--max-new-tokens", str(args.new_tokens),
                "--out", str(run / "evaluate")]  # fmt: skip
    return [*dihal, "generate", "--model", str(run / "replace"), "--prompt", "Once upon a time", "--dtype",
            args.dtype, "--n-samples", "2", "--max-new-tokens", str(args.new_tokens),
            "--out", str(run / "generate.json")]  # fmt: skip


def run_shape(name: str, args: argparse.Namespace) -> dict:
    """Every stage of ``args.stages`` not yet finished for shape ``name``; returns the saved stage figures."""
    model, run = args.models / name, args.runs / name
    run.mkdir(parents=True, exist_ok=True)
    saved_path = run / "stages.json"
    saved = json.loads(saved_path.read_text()) if saved_path.is_file() else {}
    dihal = dihal_command(args.dihal)
    for stage in args.stages:
        if stage in saved and not args.redo:
            continue
        out = run / {"locate": "locate", "replace": "replace", "evaluate": "evaluate"}.get(stage, f"replace_{stage}")
        if stage == "generate":
            out = run / "generate.json"
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        threads = 1 if stage in ("zero2", "zero3") else args.threads
        print(f"{name}: {stage} ...", file=sys.stderr, flush=True)
        figures = measured(stage_command(stage, dihal, model, run, args), run / f"{stage}.log", threads)
        figures["bytes_written"] = bytes_under(out)
        figures["checkpoint_bytes"] = bytes_under(out / "checkpoints") if out.is_dir() else 0
        figures["batch_size"] = args.batch_size  # per process (per rank under torchrun)
        saved[stage] = figures
        saved_path.write_text(json.dumps(saved, indent=1))
    return saved


def runtime_rss_gb(threads: int) -> float:
    """Peak RSS of a process that only imports torch, transformers and dihal_fast (the runtime's share).

    Read as the child's VmHWM: its ``ru_maxrss`` starts at this process's peak (Linux keeps the maximum across
    fork and exec), so in a process that had loaded a model it would report that model's."""
    peak = "next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))"
    code = f"import os; {RUNTIME}; print({peak})"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return int(out.stdout.strip().splitlines()[-1]) * 1024 / 1e9


ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def loaded_itemsize(facts: dict, dtype: str) -> int:
    """Bytes per weight as the stages load them (``auto``: the checkpoint's dtype)."""
    return ITEMSIZE[facts["dtype"] if dtype == "auto" else dtype]


SEQ_LEN = 128  # dihal replace's default --seq-len (the stages do not pass one)
ACTIVATION_VALUES = 11  # values per token, retained layer and unit of D + I at a step's peak (fitted at Qwen3-0.6B)


def activations_gb(facts: dict, layer: int, batch: int, itemsize: int) -> float:
    """GB of the activations a training step keeps for the backward into the bridge: the retained layers
    ``layer..L-1`` on ``batch`` x ``SEQ_LEN`` tokens, ~11 (D + I) values per token and layer in the weights'
    dtype (docs/DESIGN.md, "Memory at size"; the head's B T V logits are inside that constant at a 32k
    vocabulary)."""
    retained = facts["layers"] - layer
    return retained * batch * SEQ_LEN * ACTIVATION_VALUES * (facts["hidden"] + facts["intermediate"]) * itemsize / 1e9


def accounted(
    stage: str,
    facts: dict,
    runtime_gb: float,
    bridge_gb: float,
    locate_states_gb: float,
    itemsize: int,
    activation_gb: float = 0.0,
) -> dict:
    """The memory the design accounts for in ``stage`` (GB): weights in their dtype, the kept states, the
    activations of one training step, runtime.

    locate: weights + (L + 1) D^2 float64 covariances and the reservoir; replace: teacher + bridge with its
    gradient, two Adam moments and the EMA (5 float32 copies) + the retained layers' activations; ZeRO: the same
    per rank (the teacher is whole on every rank, outside the engine; ``activation_gb`` at the per-rank batch);
    evaluate: one backbone + the bridge; generate: the self-contained hybrid (<= the weights)."""
    weights = facts["weight_bytes"] / 1e9 * itemsize / ITEMSIZE[facts["dtype"]]
    states = {
        "locate": locate_states_gb,
        "replace": 5 * bridge_gb,
        "zero2": 5 * bridge_gb,
        "zero3": 5 * bridge_gb,
        "evaluate": bridge_gb,
        "generate": bridge_gb,
    }[stage]
    activations = activation_gb if stage in ("replace", "zero2", "zero3") else 0.0
    return {"weights_gb": weights, "states_gb": states, "activations_gb": activations, "runtime_gb": runtime_gb}


def located_layer(run: Path) -> int | None:
    """The layer ``dihal locate`` selected in ``run`` (the one the replace stages train a bridge for)."""
    report_path = run / "locate" / "locate.json"
    return int(json.loads(report_path.read_text())["selected_layer"]) if report_path.is_file() else None


def locate_states(run: Path, facts: dict, itemsize: int) -> float:
    """GB of locate's kept states: (L + 1) float64 D x D covariances plus the reservoir rows it filled."""
    report_path = run / "locate" / "locate.json"
    rows = 0
    if report_path.is_file():
        located = json.loads(report_path.read_text())
        capacity = located["config"]["collect"]["reservoir_size"]
        rows = min(int(located["n_tokens"]), int(capacity))
    d, layers = facts["hidden"], facts["layers"] + 1
    return (layers * d * d * 8 + layers * rows * d * itemsize) / 1e9


# The 8B models users run (their config.json): layers, width, SwiGLU width, vocabulary, KV heads x head dim,
# tied embeddings.
TARGETS = {
    "Llama-3.1-8B": (32, 4096, 14336, 128256, 8 * 128, False),
    "Qwen3-8B": (36, 4096, 12288, 151936, 8 * 128, False),
}
# The default bridge's learned float32 parameters over D^2 (one context block and the UNet, counted at D = 4,096):
# the same at every l*, since the default copies the backbone's layers 1..l*-1 and learns layer l*.
BRIDGE_PER_D2 = 381_567_104 / 4096**2
PLAN_LAYER = 3  # the plan's l*: the paper's selected hidden state of Llama-3.1-8B


def cluster_plan(
    tokens: int = 32768, reservoir: int = 30000, ranks: int = 8, batch: int = 8, seq: int = 128, layer: int = PLAN_LAYER
):
    """Memory (GB) and FLOPs of each stage for the 8B targets from docs/DESIGN.md's formula, bf16 weights, the
    default bridge at hidden state ``layer``: GPU holds the weights, the bridge's training states (its learned
    parameters with gradient, two Adam moments and EMA; its ``layer - 1`` copied backbone layers in float32, frozen:
    weights only) and one batch's logits; the host holds locate's float64 covariances and bf16 reservoir; ZeRO-3
    splits the learned parameters' gradient and Adam moments over ``ranks`` (the EMA, the copies and the teacher
    stay whole on every rank); a training step's activations are those of the retained layers ``layer..L-1``, per
    rank at ``batch``."""
    rows = []
    for name, (layers, d, ffn, vocab, kv, tied) in TARGETS.items():
        per_layer = 2 * d * d + 2 * d * kv + 3 * d * ffn + 2 * d
        params = layers * per_layer + vocab * d * (1 if tied else 2) + d
        weights = 2 * params / 1e9
        bridge = BRIDGE_PER_D2 * d * d
        copied = 4 * (layer - 1) * per_layer / 1e9
        logits = batch * seq * vocab * 4 / 1e9
        covariances = (layers + 1) * d * d * 8 / 1e9
        reservoir_gb = (layers + 1) * reservoir * d * 2 / 1e9
        states = 5 * 4 * bridge / 1e9 + copied
        activations = (layers - layer) * batch * seq * ACTIVATION_VALUES * (d + ffn) * 2 / 1e9
        zero3 = (4 * bridge + 4 * 4 * bridge / ranks) / 1e9 + copied  # EMA whole + (param, grad, 2 moments) / ranks
        checkpoint = 4 * 4 * bridge / 1e9  # bridge + 2 Adam moments + EMA, float32
        locate_flops = 2 * params * tokens
        # teacher; the copies' forward; the learned bridge's forward and backward; the retained layers' both ways
        step_flops = (2 * params + 2 * (layer - 1) * per_layer + 6 * bridge + 4 * params) * batch * seq
        rows.append({
            "model": name, "params_b": params / 1e9, "weights_gb": weights, "bridge_params_m": bridge / 1e6,
            "copied_params_m": (layer - 1) * per_layer / 1e6,
            "locate_gpu_gb": weights + logits, "locate_host_gb": covariances + reservoir_gb,
            "replace_gpu_gb": weights + states + activations + 2 * logits,
            "replace_zero3_gpu_gb_per_rank": weights + zero3 + activations + 2 * logits,
            "evaluate_gpu_gb": weights + 4 * bridge / 1e9 + copied + logits, "checkpoint_gb": checkpoint,
            "hybrid_dir_gb": weights + 4 * bridge / 1e9 + copied, "locate_tflop": locate_flops / 1e12,
            "replace_step_tflop": step_flops / 1e12,
        })  # fmt: skip
    return rows


def write_report(args: argparse.Namespace) -> None:
    """``bench/results/rehearsal.json`` from every shape's saved stages."""
    runtime = runtime_rss_gb(args.threads)
    rows, figures, body = [], {}, []
    for name in args.shapes:
        run, facts = args.runs / name, model_facts(args.models / name)
        saved_path = run / "stages.json"
        if not saved_path.is_file():
            continue
        saved = json.loads(saved_path.read_text())
        hybrid = run / "replace" / "hybrid"
        bridge_gb = bridge_bytes(hybrid) / 1e9 if hybrid.is_dir() else 0.0
        itemsize = loaded_itemsize(facts, args.dtype)
        states = locate_states(run, facts, itemsize)
        rates = gemm_rates(facts["hidden"])
        figures[name] = {"facts": facts, "stages": saved, "gemm_gflops_1thread": rates, "runtime_gb": runtime}
        for stage in STAGES:
            if stage not in saved:
                continue
            s, layer = saved[stage], located_layer(run)
            batch = int(s.get("batch_size", args.batch_size))
            step = activations_gb(facts, layer, batch, itemsize) if layer is not None else 0.0
            acc = accounted(stage, facts, runtime, bridge_gb, states, itemsize, step)
            total = sum(acc.values())
            s["accounted"] = {**acc, "ratio": s["peak_rss_gb"] / total}
            rows.append(
                [
                    name,
                    stage,
                    str(batch) if stage in ("replace", "zero2", "zero3") else "",
                    f"{s['wall_s']:.0f}",
                    f"{s['cpu_s']:.0f}",
                    f"{s['peak_rss_gb']:.2f}",
                    f"{acc['weights_gb']:.2f}",
                    f"{acc['states_gb']:.2f}",
                    f"{acc['activations_gb']:.2f}",
                    f"{acc['runtime_gb']:.2f}",
                    f"{s['peak_rss_gb'] / total:.2f}",
                    f"{s['bytes_written'] / 1e9:.3f}",
                ]
            )
        body.append(
            f"{name}: {facts['layers']} layers x {facts['hidden']}, {facts['weight_bytes'] / 1e9:.2f} GB of "
            f"{facts['dtype']} weights; one-thread GEMM (GFLOP per CPU-second) at width {facts['hidden']}: float32 "
            f"{rates['float32']:.1f} GFLOP/s, bfloat16 {rates['bfloat16']:.1f} GFLOP/s."
        )
    header = ["shape", "stage", "batch", "wall s", "CPU s", "peak RSS GB", "weights GB", "states GB",
              "activations GB", "runtime GB", "peak / accounted", "written GB"]  # fmt: skip
    figures["stages"] = rows_figure(header, rows)
    text = (
        "Rehearsal, random weights (bench/make_rehearsal_model.py): the pipeline as a user runs it, each stage "
        f"in its own niced process ({args.threads} thread(s); ZeRO: 2 ranks x 1 thread), on a shared 2-core "
        "machine, so wall seconds include other jobs' load and CPU seconds are the load-robust figure.\n\n"
        + table(header, rows)
        + "\n\n"
        + "\n".join(body)
        + "\n\naccounted = weights in their dtype + the states the stage keeps + the activations of one training "
        "step (batch: blocks of 128 tokens per process; docs/DESIGN.md, 'Memory at size') + the runtime (torch, "
        "transformers and dihal_fast imported)."
    )
    report("The pipeline at a real model's size (rehearsal, random weights)", text, question="rehearsal",
           figures=figures)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_rehearsal_options(parser)
    parser.add_argument("--runs", type=Path, required=True, help="where the run directories go (outside the repo)")
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--text", type=Path, default=TEXT)
    parser.add_argument("--max-tokens", type=int, default=8192, help="tokens dihal locate reads")
    parser.add_argument("--sample-size", type=int, default=3000, help="locate's tokens per subsample")
    parser.add_argument("--repeats", type=int, default=10, help="locate's subsamples per layer")
    parser.add_argument("--steps", type=int, default=4, help="bridge training steps")
    parser.add_argument("--batch-size", type=int, default=8, help="blocks per forward pass (locate, replace)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per sample")
    parser.add_argument("--dtype", default="auto", help="every stage's --dtype (auto: the checkpoint's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dihal", default=shutil.which("dihal") or str(Path(sys.executable).with_name("dihal")))
    parser.add_argument("--redo", action="store_true", help="rerun stages already finished")
    parser.add_argument("--report", action="store_true", help="write bench/results/rehearsal.json at the end")
    parser.add_argument("--no-run", action="store_true", help="only write the report from the saved stages")
    parser.add_argument("--plan", action="store_true", help="print the 8B plan of docs/CLUSTER.md")
    args = parser.parse_args()
    if args.plan:
        print(json.dumps(cluster_plan(), indent=1))
        return
    if not args.no_run:
        for name in args.shapes:
            run_shape(name, args)
    if args.report or args.no_run:
        write_report(args)


if __name__ == "__main__":
    main()
