"""What does `dihal locate` cost as the model grows, and what will a 32-layer, 4,096-wide model cost?

Builds random Llama checkpoints (heads = width / 64, SwiGLU width 2.6875 x width rounded to 64 as in
Llama-2-7B's 11,008 / 4,096; the tokenizer of ``dihal_fast.testing.tiny``, whose checkpoint helper has no
intermediate-size knob), runs the real ``dihal locate`` on each in a fresh process (cwd outside the source
tree, default repeats and sample size, the shipped corpus) with ``--precision float64``, then reruns the
selection alone with ``--resume --precision float32`` on the same collection. Per run: wall and CPU
seconds, peak RSS of that process only (``os.wait4``), the CPU used by other processes meanwhile, and
the phase split read from the child's plain progress lines (``DIHAL_PROGRESS=plain``). A separate child
that only loads each model and reads every weight gives the weights' share of the peak.

The machine is shared with niced training jobs, so the children run with a pinned thread count and the
CPU-second figures are the load-robust ones. Cost models, fitted on relative error:
collection CPU s / token = a + b L D^2 (forward and covariance update both grow as L D^2);
selection CPU s = a + b calls flops(n, D), calls = repeats x (L - 1), flops following the proxies' route
(n >= D: kNN 2 n^2 D, covariance and whitening 2 n D^2, Cholesky D^3 / 3; n < D: the shared Gram product
2 n^2 D and 2 n^3 / 3; both: local Gram matrices 2 n (k + 1)^2 D); peak RSS = (a + b weight bytes) +
(c + d statistics bytes), statistics = (L + 1) D^2 x 8 (float64 covariances) + (L + 1) R D x 4 (the
float32 reservoir, R = min(tokens, repeats x sample size)). The 32 x 4,096 figures are extrapolations and
are labelled so; one geometry_proxies call at n x 4,096 is also timed directly as a check of the selection's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from _common import best_time, markdown_tables, report, table, target
from bench_contention import busy_cpu_seconds, process_cpu_seconds

from dihal_fast.select import DEFAULT_REPEATS, DEFAULT_SAMPLE_SIZE

LLAMA_FFN_RATIO = 11008 / 4096  # Llama-2-7B's SwiGLU width over its hidden width
K = 16  # dihal locate's default --k
THREAD_VARIABLES = ("DIHAL_NUM_THREADS", "OMP_", "GOMP_", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
BUILD = (  # a child builds each checkpoint, so that this process's RSS stays below every measured child's
    "import sys\nsys.path.insert(0, sys.argv[1])\nfrom bench_locate_scaling import Shape, make_checkpoint\n"
    "make_checkpoint(Shape(int(sys.argv[3]), int(sys.argv[4])), sys.argv[2], int(sys.argv[5]))\n"
)
LOAD = (  # safetensors weights are mapped lazily: read every parameter so that they are all resident
    "import sys\nfrom dihal_fast.common.hf_loading import load_causal_lm\n"
    "model, _ = load_causal_lm(sys.argv[1])\nsum(float(p.detach().sum()) for p in model.parameters())\n"
)
UNIT_COSTS = (  # a child measures the time model's unit costs for a checkpoint's config, on the pinned threads
    "import json, sys\nsys.path.insert(0, sys.argv[1])\nfrom bench_locate_scaling import unit_costs\n"
    "print(json.dumps(unit_costs(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6:])))\n"
)
ANCHOR = (
    "import json, sys, time\nimport numpy as np, dihal_fast as df\n"
    "X = np.random.default_rng(0).standard_normal((int(sys.argv[1]), int(sys.argv[2])), dtype=np.float32)\n"
    "out = {}\nfor precision in sys.argv[3:]:\n"
    "    start = time.process_time(); df.geometry_proxies(X, precision=precision)\n"
    "    out[precision] = time.process_time() - start\nprint(json.dumps(out))\n"
)


@dataclass(frozen=True)
class Shape:
    """A Llama of ``layers`` decoder layers, hidden width ``width`` and ``vocab`` embeddings (untied head)."""

    layers: int
    width: int
    vocab: int = 384

    @property
    def ffn(self) -> int:
        return max(64, 64 * round(LLAMA_FFN_RATIO * self.width / 64))

    @property
    def params(self) -> int:
        """Parameters: embeddings and head 2 V D, per layer 4 D^2 + 3 D F + 2 D, final norm D."""
        D = self.width
        return 2 * self.vocab * D + self.layers * (4 * D * D + 3 * D * self.ffn + 2 * D) + D

    def __str__(self) -> str:
        return f"{self.layers} x {self.width}"


@dataclass
class ChildRun:
    """One child process: wall and own CPU seconds, own peak RSS (bytes), other processes' mean cores,
    and ``marks``: (wall s, child CPU s, line) for every line it wrote on stderr."""

    wall_s: float
    cpu_s: float
    peak_bytes: float
    other_cores: float
    marks: list[tuple[float, float, str]] = field(default_factory=list)

    def cpu_share(self, begin: str, end: str) -> float:
        """Child CPU s per wall s between the last line holding ``begin`` before the last line holding
        ``end`` and that line (whole run if either is missing): converts a phase's wall time to CPU time."""
        ends = [i for i, m in enumerate(self.marks) if end in m[2]]
        begins = [i for i, m in enumerate(self.marks[: ends[-1]] if ends else []) if begin in m[2]]
        if not begins or self.marks[ends[-1]][0] <= self.marks[begins[-1]][0]:
            return self.cpu_s / self.wall_s
        (w0, c0, _), (w1, c1, _) = self.marks[begins[-1]], self.marks[ends[-1]]
        return (c1 - c0) / (w1 - w0)


@dataclass
class Point:
    """Measurements of one model: the float64 locate run, the model-only load, the selection reruns."""

    shape: Shape
    locate: ChildRun
    load: ChildRun
    report: dict
    select_cpu: dict[str, float]  # precision -> selection CPU s
    costs: dict[str, float] = field(default_factory=dict)  # unit_costs of the shape

    @property
    def tokens(self) -> int:
        return int(self.report["n_tokens"])

    @property
    def collect_cpu(self) -> float:
        return self.report["timings"]["collect_s"] * self.locate.cpu_share("collecting", "collect:")


def child_env(threads: int) -> dict[str, str]:
    """This environment without thread settings, then ``threads`` pinned (0: the package's default)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(THREAD_VARIABLES)}
    env["DIHAL_PROGRESS"] = "plain"
    if threads > 0:
        env.update(DIHAL_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    return env


def run_child(command: list[str], env: dict[str, str], cwd: Path) -> ChildRun:
    """Run ``command`` to completion, timing it and sampling its CPU time at each stderr line.

    Its ``ru_maxrss`` is its own peak only above this process's: Linux starts a spawned child's maximum
    at the RSS of the process that spawned it, so this process builds no model itself."""
    machine_start, start = busy_cpu_seconds(), time.perf_counter()
    child = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    marks = [(time.perf_counter() - start, process_cpu_seconds(child.pid), line.rstrip()) for line in child.stderr]
    _, status, usage = os.wait4(child.pid, 0)
    wall, machine_busy = time.perf_counter() - start, busy_cpu_seconds() - machine_start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n" + "\n".join(m[2] for m in marks[-20:]))
    cpu = usage.ru_utime + usage.ru_stime
    return ChildRun(wall, cpu, usage.ru_maxrss * 1024.0, max(0.0, machine_busy - cpu) / wall, marks)


def make_checkpoint(shape: Shape, out: str | Path, seq_len: int, seed: int = 0) -> Path:
    """Write a random Llama of ``shape`` with the tiny test tokenizer to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from dihal_fast.testing.tiny import make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer(shape.vocab)
    heads = max(1, shape.width // 64)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.width,
        intermediate_size=shape.ffn,
        num_hidden_layers=shape.layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=seq_len,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return Path(out)


def forward_flops(config: dict, seq_len: int) -> float:
    """Forward flops per token of a decoder-only checkpoint's ``config.json`` without its LM head (``dihal locate``
    reads hidden states only): 2 x the layers' linear weights, plus causal attention's QK^T and AV (2 seq d_q on
    average per token and layer)."""
    D, F, L = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or D // heads
    kv = config.get("num_key_value_heads") or heads
    q, k = heads * head_dim, kv * head_dim
    linear = D * q + 2 * D * k + q * D + 3 * D * F
    return L * (2.0 * linear + 2.0 * seq_len * q)


def unit_costs(model_dir: str, batch: int, seq_len: int, sample: int, precisions: list[str]) -> dict[str, float]:
    """The time model's unit costs for the architecture in ``model_dir``'s config.json, in CPU seconds on this
    process's threads (float32, random weights and rows): per token, one decoder layer's forward (a 2-layer model
    minus a 1-layer one, hidden states returned as locate asks for them) and the rest of the forward (embedding,
    final norm); per token and hidden state, one StreamingCovariance update; one geometry_proxies call on
    ``sample x D`` rows per precision; and the float32 GEMM rate of the layer's widest product."""
    import copy

    import torch
    from transformers import AutoConfig, AutoModel

    import dihal_fast as df

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(model_dir)
    D, tokens = int(config.hidden_size), batch * seq_len
    ids = torch.randint(0, int(config.vocab_size), (batch, seq_len))

    def forward(layers: int) -> float:
        cut = copy.deepcopy(config)
        cut.num_hidden_layers = layers
        if getattr(cut, "layer_types", None):
            cut.layer_types = cut.layer_types[:layers]
        model = AutoModel.from_config(cut, dtype=torch.float32).eval()
        with torch.no_grad():
            return best_time(
                lambda: model(input_ids=ids, output_hidden_states=True, use_cache=False), 5, clock=time.process_time
            )

    one, two = forward(1), forward(2)
    layer = max(two - one, 0.0)
    x = torch.randn(tokens, D)
    w = torch.randn(int(config.intermediate_size), D)
    gemm = (
        2.0
        * tokens
        * D
        * w.shape[0]
        / best_time(lambda: torch.nn.functional.linear(x, w), clock=time.process_time)
        / 1e9
    )
    block = np.random.default_rng(0).standard_normal((tokens, D), dtype=np.float32)
    cov = best_time(lambda: df.StreamingCovariance(D).update(block), clock=time.process_time) / tokens
    from bench_proxies import data  # the proxies bench's rows: low rank plus noise with an offset, as hidden states

    rows = data(sample, D)
    proxies = {
        p: best_time(lambda p=p: df.geometry_proxies(rows, precision=p), 2, clock=time.process_time) for p in precisions
    }
    return {
        "layer_s_per_token": layer / tokens,
        "base_s_per_token": max(one - layer, 0.0) / tokens,
        "covariance_s_per_token_state": cov,
        "gemm_gflops": gemm,
        **{f"proxies_s_{p}": v for p, v in proxies.items()},
    }


def measure_unit_costs(model_dir: Path, args: argparse.Namespace, work: Path) -> dict[str, float]:
    """:func:`unit_costs` of ``model_dir`` in a child on the pinned threads."""
    command = [sys.executable, "-c", UNIT_COSTS, str(Path(__file__).parent), str(model_dir), str(args.batch_size)]
    command += [str(args.seq_len), str(DEFAULT_SAMPLE_SIZE), *args.precisions]
    child = subprocess.run(command, env=child_env(args.threads), cwd=work, capture_output=True, text=True)
    if child.returncode != 0:
        raise RuntimeError(f"unit costs of {model_dir} failed:\n{child.stderr[-2000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


@dataclass
class TimePrediction:
    """CPU seconds of one ``dihal locate`` run from unit costs: the load (measured: imports and reading the
    weights), the collection (tokens x (L layers' forward + the rest of the forward + (L + 1) covariance
    updates)) and the selection (calls x one proxies call)."""

    load: float
    collect: float
    select: float

    @property
    def total(self) -> float:
        return self.load + self.collect + self.select


def predict_time(costs: dict[str, float], layers: int, tokens: int, calls: int, precision: str, load: float):
    per_token = layers * costs["layer_s_per_token"] + costs["base_s_per_token"]
    per_token += (layers + 1) * costs["covariance_s_per_token_state"]
    return TimePrediction(load, tokens * per_token, calls * costs[f"proxies_s_{precision}"])


def measure(shape: Shape, args: argparse.Namespace, work: Path) -> Point:
    """Build ``shape``, time the model load alone, run ``dihal locate`` (float64) and the reruns."""
    name = f"{shape.layers}x{shape.width}"
    env, model, run = child_env(args.threads), work / f"model_{name}", work / f"run_{name}"
    subprocess.run(
        [
            sys.executable,
            "-c",
            BUILD,
            str(Path(__file__).parent),
            str(model),
            str(shape.layers),
            str(shape.width),
            str(args.seq_len),
        ],
        env=env,
        cwd=work,
        check=True,
        capture_output=True,
    )
    shutil.rmtree(run, ignore_errors=True)
    load = run_child([sys.executable, "-c", LOAD, str(model)], env, work)
    base = [
        args.dihal,
        "locate",
        "--model",
        str(model),
        "--out",
        str(run),
        "--max-tokens",
        str(args.max_tokens),
        "--seq-len",
        str(args.seq_len),
        "--batch-size",
        str(args.batch_size),
    ]
    locate = run_child(base + ["--precision", "float64"], env, work)
    result = json.loads((run / "locate.json").read_text())
    select_cpu = {"float64": result["timings"]["select_s"] * locate.cpu_share("collect", "proxies:")}
    for precision in args.precisions:
        if precision != "float64":
            rerun = run_child(base + ["--resume", "--precision", precision], env, work)
            seconds = json.loads((run / "locate.json").read_text())["timings"]["select_s"]
            select_cpu[precision] = seconds * rerun.cpu_share("collecting", "proxies:")
    costs = measure_unit_costs(model, args, work)
    if args.work is None:
        shutil.rmtree(model)
        shutil.rmtree(run)
    point = Point(shape, locate, load, result, select_cpu, costs)
    print(
        f"{shape}: {point.tokens} tokens, collect {point.collect_cpu:.1f} CPU s, select "
        + ", ".join(f"{p} {s:.1f}" for p, s in select_cpu.items())
        + f" CPU s, total {locate.wall_s:.1f} s wall / {locate.cpu_s:.1f} s CPU, "
        f"peak {locate.peak_bytes / 2**20:.0f} MB, "
        f"other processes {locate.other_cores:.2f} cores",
        flush=True,
    )
    return point


@dataclass
class Check:
    """The --check run: its config, the locate run and the load-only child, the locate report and unit costs."""

    name: str
    config: dict
    locate: ChildRun
    load: ChildRun
    report: dict
    costs: dict[str, float]

    @property
    def tokens(self) -> int:
        return int(self.report["n_tokens"])

    def measured(self) -> TimePrediction:
        """The run's own split: load (the load-only child), collection and selection (phase CPU), total as run."""
        timings = self.report["timings"]
        collect = timings["collect_s"] * self.locate.cpu_share("collecting", "collect:")
        select = timings["select_s"] * self.locate.cpu_share("collect", "proxies:")
        return TimePrediction(self.locate.cpu_s - collect - select, collect, select)

    def predicted(self) -> TimePrediction:
        layers = int(self.config["num_hidden_layers"])
        calls = DEFAULT_REPEATS * (layers - 1)
        return predict_time(self.costs, layers, self.tokens, calls, "float64", self.load.cpu_s)


def check_run(model: Path, args: argparse.Namespace, work: Path) -> Check:
    """``dihal locate`` on ``model`` (float32, float64 selection, the sweep's settings, --check-tokens) with the
    load-only child and the unit costs of its config."""
    env, run = child_env(args.threads), work / "run_check"
    shutil.rmtree(run, ignore_errors=True)
    load = run_child([sys.executable, "-c", LOAD, str(model)], env, work)
    command = [args.dihal, "locate", "--model", str(model), "--out", str(run), "--max-tokens", str(args.check_tokens)]
    command += ["--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size), "--dtype", "float32"]
    command += ["--precision", "float64"] + (["--corpus", *args.check_corpus] if args.check_corpus else [])
    locate = run_child(command, env, work)
    report = json.loads((run / "locate.json").read_text())
    if args.work is None:
        shutil.rmtree(run)
    config = json.loads((model / "config.json").read_text())
    check = Check(model.name, config, locate, load, report, measure_unit_costs(model, args, work))
    m, p = check.measured(), check.predicted()
    print(f"check {model.name}: measured {m.total:.1f} CPU s, predicted {p.total:.1f}", flush=True)
    return check


def time_model_table(points: list[Point], check: Check | None, precisions: list[str]) -> tuple[str, list]:
    """Predicted / measured CPU seconds of every run (the sweep's and --check's) under the unit-cost model, and
    the relative error of the total; returns the table and its rows."""
    rows = []

    def row(name: str, measured: TimePrediction, predicted: TimePrediction, costs: dict[str, float]) -> None:
        error = predicted.total / measured.total - 1.0
        rows.append(
            [
                name,
                f"{costs['layer_s_per_token'] * 1e3:.3g}",
                f"{costs['gemm_gflops']:.0f}",
                f"{measured.load:.1f} / {predicted.load:.1f}",
                f"{measured.collect:.1f} / {predicted.collect:.1f}",
                f"{measured.select:.1f} / {predicted.select:.1f}",
                f"{measured.total:.1f} / {predicted.total:.1f}",
                f"{100 * error:+.0f} %",
            ]
        )

    for p in points:
        layers = p.shape.layers
        select = p.select_cpu["float64"]
        measured = TimePrediction(p.locate.cpu_s - p.collect_cpu - select, p.collect_cpu, select)
        predicted = predict_time(p.costs, layers, p.tokens, selection_calls(p.shape), "float64", p.load.cpu_s)
        row(str(p.shape), measured, predicted, p.costs)
    if check is not None:
        row(
            f"{check.name} ({check.config['num_hidden_layers']} x {check.config['hidden_size']})",
            check.measured(),
            check.predicted(),
            check.costs,
        )
    header = [
        "run",
        "one layer's forward CPU ms / token",
        "float32 GEMM GFLOP/CPU-s",
        "load and start-up CPU s measured / load-only child",
        "collection CPU s measured / predicted",
        "selection (float64) CPU s measured / predicted",
        "locate CPU s measured / predicted",
        "error of the prediction",
    ]
    return table(header, rows), rows


def proxy_flops(n: int, width: int, k: int = K) -> float:
    """Floating-point operations of one geometry_proxies call on ``n x width`` rows (see the module docstring)."""
    local = 2.0 * n * (k + 1) ** 2 * width
    if n < width:
        return 2.0 * n * n * width + 2.0 * n**3 / 3 + local
    return 2.0 * n * n * width + 2.0 * n * width**2 + width**3 / 3 + local


def statistics_bytes(shape: Shape, reservoir_tokens: int) -> float:
    """Bytes of the collection state: float64 covariances and the float32 reservoir of every hidden state."""
    states = shape.layers + 1
    return states * shape.width**2 * 8.0 + states * reservoir_tokens * shape.width * 4.0


def selection_calls(shape: Shape) -> int:
    """geometry_proxies calls of the default selection: ``repeats`` subsamples of every candidate layer 1..L-1."""
    return DEFAULT_REPEATS * (shape.layers - 1)


def selection_work(shape: Shape) -> float:
    """calls x flops of the default selection."""
    return selection_calls(shape) * proxy_flops(DEFAULT_SAMPLE_SIZE, shape.width)


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Intercept ``a >= 0`` and slope ``b`` of ``y = a + b x`` by least squares on the relative error."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    a, b = np.linalg.lstsq(np.stack([np.ones_like(x), x], 1) / y[:, None], np.ones_like(y), rcond=None)[0]
    if a < 0:
        a, b = 0.0, float(np.sum(x / y) / np.sum((x / y) ** 2))
    return float(a), float(b)


@dataclass
class Model:
    """A fitted cost model ``y = a + b x``."""

    a: float
    b: float

    def __call__(self, x: float) -> float:
        return self.a + self.b * x


def fit_models(points: list[Point], precisions: list[str]) -> dict[str, Model]:
    """Collection per token, selection per precision, model RSS and statistics RSS (see the module docstring)."""
    shapes = [p.shape for p in points]
    ld2 = np.array([s.layers * s.width**2 for s in shapes], float)
    models = {"collect": Model(*fit_line(ld2, [p.collect_cpu / p.tokens for p in points]))}
    work = np.array([selection_work(s) for s in shapes])
    for precision in precisions:
        models[precision] = Model(*fit_line(work, [p.select_cpu[precision] for p in points]))
    weights = np.array([4.0 * s.params for s in shapes])
    models["weights"] = Model(*fit_line(weights, [p.load.peak_bytes for p in points]))  # RSS with the weights read
    stats = np.array([statistics_bytes(p.shape, min(p.tokens, DEFAULT_REPEATS * DEFAULT_SAMPLE_SIZE)) for p in points])
    models["statistics"] = Model(*fit_line(stats, [max(1.0, p.locate.peak_bytes - p.load.peak_bytes) for p in points]))
    return models


def predict(models: dict[str, Model], shape: Shape, tokens: int, precisions: list[str]) -> dict[str, float]:
    """Collection CPU s / token, selection CPU s per precision and peak RSS bytes of ``shape``."""
    reservoir = min(tokens, DEFAULT_REPEATS * DEFAULT_SAMPLE_SIZE)
    out = {"collect": models["collect"](shape.layers * shape.width**2)}
    out.update({p: models[p](selection_work(shape)) for p in precisions})
    out["peak"] = models["weights"](4.0 * shape.params) + models["statistics"](statistics_bytes(shape, reservoir))
    return out


def anchor(args: argparse.Namespace, work: Path) -> dict[str, float]:
    """CPU seconds of one geometry_proxies call on ``sample size x predicted width`` random rows, per precision."""
    command = [sys.executable, "-c", ANCHOR, str(DEFAULT_SAMPLE_SIZE), str(args.predict.width), *args.precisions]
    child = subprocess.run(command, env=child_env(args.threads), cwd=work, capture_output=True, text=True, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])


def measured_table(points: list[Point], precisions: list[str]) -> str:
    rows = []
    for p in points:
        timings = p.report["timings"]
        rows.append(
            [
                str(p.shape),
                f"{p.shape.params / 1e6:.1f}",
                p.tokens,
                f"{timings['collect_s']:.1f}",
                f"{p.collect_cpu:.1f}",
                f"{p.tokens / timings['collect_s']:.0f}",
                f"{p.tokens / p.collect_cpu:.0f}",
                *(f"{p.select_cpu[q]:.1f}" for q in precisions),
                f"{timings['select_s']:.1f}",
                f"{p.locate.wall_s:.1f}",
                f"{p.locate.cpu_s:.1f}",
                f"{p.locate.peak_bytes / 2**20:.0f}",
                f"{p.load.peak_bytes / 2**20:.0f}",
                f"{p.locate.other_cores:.2f}",
            ]
        )
    header = [
        "layers x width",
        "params M",
        "tokens",
        "collect wall s",
        "collect CPU s",
        "tokens / s",
        "tokens / CPU-s",
        *(f"select {q} CPU s" for q in precisions),
        "select float64 wall s",
        "total wall s",
        "total CPU s",
        "peak RSS MB",
        "RSS with weights read MB",
        "other processes (cores)",
    ]
    return table(header, rows)


def fit_table(
    points: list[Point],
    models: dict[str, Model],
    predicted: dict[str, float],
    target: Shape,
    precisions: list[str],
    checks: dict[str, float],
) -> str:
    """Measured / fitted for each measured shape, and the extrapolation to ``target`` (the selection also
    as calls x one call measured at ``target``'s width, from ``checks``)."""

    def both(measured: float, fitted: float, scale: float) -> str:
        return f"{measured * scale:.3g} / {fitted * scale:.3g}"

    fitted = [predict(models, p.shape, p.tokens, precisions) for p in points]
    rows = [
        [
            "collection CPU ms / token",
            f"{models['collect'].a * 1e3:.3g} + {models['collect'].b * 1e3:.3g} L D^2",
            *(both(p.collect_cpu / p.tokens, f["collect"], 1e3) for p, f in zip(points, fitted)),
            f"{predicted['collect'] * 1e3:.3g}",
        ]
    ]
    for q in precisions:
        m = models[q]
        rows.append(
            [
                f"selection CPU s, {q}",
                f"{m.a:.3g} + {m.b * 1e9:.3g} calls x GFLOP",
                *(both(p.select_cpu[q], f[q], 1) for p, f in zip(points, fitted)),
                f"{predicted[q]:.4g}",
            ]
        )
        if q in checks:
            rows.append(
                [
                    f"selection CPU s, {q}",
                    f"calls x one call measured at D = {target.width}",
                    *("-" for _ in points),
                    f"{selection_calls(target) * checks[q]:.4g}",
                ]
            )
    w, s = models["weights"], models["statistics"]
    rows.append(
        [
            "peak RSS GB",
            f"({w.a / 2**30:.2g} + {w.b:.3g} weights) + ({s.a / 2**30:.2g} + {s.b:.3g} statistics)",
            *(both(p.locate.peak_bytes, f["peak"], 2**-30) for p, f in zip(points, fitted)),
            f"{predicted['peak'] / 2**30:.3g}",
        ]
    )
    header = ["quantity (measured / fitted)", "fitted model", *(str(p.shape) for p in points), f"{target} EXTRAPOLATED"]
    return table(header, rows)


def plot(
    points: list[Point],
    models: dict[str, Model],
    target: Shape,
    predicted: dict[str, float],
    precisions: list[str],
    checks: dict[str, float],
    path: str,
) -> None:
    """Log-log panels of the three cost models: measured points, fitted line, extrapolated target (and
    the selection as calls x one call measured at the target width, from ``checks``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokens = max(p.tokens for p in points)
    panels = [
        (
            "collection CPU s / token",
            "L D^2",
            lambda s: s.layers * s.width**2,
            {"collect": [p.collect_cpu / p.tokens for p in points]},
        ),
        (
            "selection CPU s",
            "calls x flops of the proxies",
            selection_work,
            {q: [p.select_cpu[q] for p in points] for q in precisions},
        ),
        (
            "peak RSS bytes",
            "weight + statistics bytes",
            lambda s: 4.0 * s.params + statistics_bytes(s, min(tokens, DEFAULT_REPEATS * DEFAULT_SAMPLE_SIZE)),
            {"peak": [p.locate.peak_bytes for p in points]},
        ),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    shapes = [p.shape for p in points]
    for ax, (ylabel, xlabel, feature, series) in zip(axes, panels):
        xs = np.array([feature(s) for s in shapes] + [feature(target)])
        order = np.argsort(xs)
        for name, ys in series.items():
            line = ax.loglog(xs[:-1], ys, "o", label=f"{name}: measured")[0]
            fitted = [predict(models, s, p.tokens, precisions)[name] for s, p in zip(shapes, points)]
            fitted.append(predicted[name])
            ax.loglog(xs[order], np.array(fitted)[order], ":x", color=line.get_color(), label=f"{name}: fitted")
            ax.loglog(xs[-1:], fitted[-1:], "*", ms=14, color=line.get_color(), label=f"{name}: {target} EXTRAPOLATED")
            if name in checks:
                ax.loglog(
                    xs[-1:],
                    [selection_calls(target) * checks[name]],
                    "D",
                    ms=8,
                    color=line.get_color(),
                    label=f"{name}: {target}, calls x one call measured at D = {target.width}",
                )
        for s, x in zip(shapes, xs):
            ax.annotate(str(s), (x, ax.get_ylim()[0]), fontsize=7, rotation=90, va="bottom")
        ax.set(xlabel=xlabel, ylabel=ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"dihal locate cost vs model size (1 process, measured points and the {target} extrapolation)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# The 8B models of docs/CLUSTER.md's plan (their config.json values) and the assumptions of its hours.
PLAN_MODELS = {
    "Llama-3.1-8B": {"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256},
    "Qwen3-8B": {"num_hidden_layers": 36, "hidden_size": 4096, "intermediate_size": 12288,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936},
}  # fmt: skip
H100_BF16_TFLOPS = 989.0  # H100 SXM dense bf16 tensor-core peak (NVIDIA's datasheet, without sparsity)
H100_FORWARD_MFU = 0.40  # assumed share of that peak for a batched bf16 forward
H100_TRAIN_MFU = 0.35  # assumed share for the replace step (forward + backward)
H100_FP64_TFLOPS, H100_FP64_SHARE = 67.0, 0.5  # FP64 tensor-core peak; assumed share for the covariance SYRKs
NVLINK_GBPS = 350.0  # assumed effective all-gather / reduce-scatter bandwidth per rank (NVLink 4, 8 GPUs)


def plan_hours(record: dict, tokens: int = 32768, steps: int = 300, batch: int = 8, seq: int = 128) -> str:
    """Hours per stage of the 8B plan from the stated assumptions (GPU parts) and this record's measured unit
    costs (host parts: covariance updates and proxies on one host core, at D = 4,096). EXTRAPOLATED: no GPU
    run backs the GPU figures."""
    anchor_s = record["figures"]["anchor_cpu_s"]
    units = record["figures"]["time_model"]["unit_costs"]
    widest = max(units, key=lambda shape: int(shape.split(" x ")[1]))
    width = int(widest.split(" x ")[1])
    rows = []
    for name, config in PLAN_MODELS.items():
        L, D = config["num_hidden_layers"], config["hidden_size"]
        forward = forward_flops(config, seq) * tokens
        gpu_locate_s = forward / (H100_BF16_TFLOPS * 1e12 * H100_FORWARD_MFU)
        # on the GPU for CUDA hidden states: (L + 1) SYRKs of D^2 multiply-adds per token (2 D^2 flops, half kept)
        covariance_s = tokens * (L + 1) * D * D / (H100_FP64_TFLOPS * 1e12 * H100_FP64_SHARE)
        host_covariance_s = tokens * (L + 1) * units[widest]["covariance_s_per_token_state"] * (D / width) ** 2
        calls = DEFAULT_REPEATS * (L - 1)
        proxies_s = {p: calls * v for p, v in anchor_s.items()}
        params = forward_flops(config, 0) / 2 + 2 * config["vocab_size"] * D  # layers' weights, embeddings, head
        bridge = 515_829_888 * (D / 4096) ** 2  # the default bridge's float32 parameters at D = 4,096
        # bench_rehearsal's count: teacher forward 2 P, bridge forward and backward 6 B, upper layers 4 P
        step_flops = (6 * params + 6 * bridge) * batch * seq
        step_s = step_flops / (H100_BF16_TFLOPS * 1e12 * H100_TRAIN_MFU)
        zero3_s = step_s / 8 + 3 * 4 * bridge / (NVLINK_GBPS * 1e9)  # compute split 8 ways + params / grads moved
        rows.append(
            [
                name,
                f"{tokens:,}",
                f"{gpu_locate_s:.1f} s",
                f"{covariance_s:.1f} s (one host core: {host_covariance_s / 3600:.2f} h)",
                ", ".join(f"{p} {v / 3600:.2f} h" for p, v in proxies_s.items()),
                f"{step_s:.2f} s x {steps} = {steps * step_s / 60:.1f} min",
                f"{zero3_s:.3f} s x {steps} = {steps * zero3_s / 60:.1f} min",
            ]
        )
    header = [
        "model",
        "locate tokens",
        "locate forward, 1 x H100 (EXTRAPOLATED)",
        "locate covariance updates, 1 x H100 (EXTRAPOLATED)",
        f"locate proxies ({DEFAULT_REPEATS} x (L - 1) calls at 3,000 x 4,096), 1 host core",
        f"replace, 1 x H100, {batch} x {seq} tokens per step (EXTRAPOLATED)",
        "replace, 8 x H100 ZeRO-3, same global batch (EXTRAPOLATED)",
    ]
    return table(header, rows)


def parse_shape(text: str) -> Shape:
    """``LAYERSxWIDTH`` -> :class:`Shape`."""
    try:
        layers, width = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LAYERSxWIDTH such as 16x1024, got {text!r}") from None
    return Shape(layers, width)


def loads() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", type=int, nargs="+", default=[256, 1024, 2048], help="hidden widths at --layers")
    parser.add_argument("--layers", type=int, default=8, help="decoder layers of the --widths models")
    parser.add_argument(
        "--extra",
        type=parse_shape,
        nargs="*",
        default=[Shape(16, 1024)],
        metavar="LxD",
        help="further LAYERSxWIDTH models (none: pass --extra with no value)",
    )
    parser.add_argument("--max-tokens", type=int, default=12288, help="dihal locate --max-tokens (blocks of --seq-len)")
    parser.add_argument("--seq-len", type=int, default=128, help="dihal locate --seq-len (also the models' context)")
    parser.add_argument("--batch-size", type=int, default=8, help="dihal locate --batch-size (blocks per forward)")
    parser.add_argument(
        "--check",
        type=Path,
        default=None,
        metavar="MODEL",
        help="also run dihal locate on this checkpoint (e.g. bench/make_rehearsal_model.py's qwen3-0.6b) and compare "
        "its CPU time with the time model's prediction from unit costs measured on its config",
    )
    parser.add_argument("--check-tokens", type=int, default=8192, help="dihal locate --max-tokens of the --check run")
    parser.add_argument("--check-corpus", nargs="+", default=None, help="dihal locate --corpus of the --check run")
    parser.add_argument(
        "--precisions",
        nargs="+",
        default=["float64", "float32"],
        choices=["float64", "float32"],
        help="selection precisions; float64 runs with the collection, others rerun it with --resume",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="DIHAL_NUM_THREADS and OMP_NUM_THREADS of the children (0: the package's adaptive default)",
    )
    parser.add_argument(
        "--predict",
        type=parse_shape,
        default=Shape(32, 4096, 32000),
        metavar="LxD",
        help="shape to extrapolate to (vocabulary --predict-vocab, untied head)",
    )
    parser.add_argument("--predict-vocab", type=int, default=32000, help="vocabulary of --predict (its weights)")
    parser.add_argument("--predict-tokens", type=int, default=500_000, help="corpus tokens of the extrapolated run")
    parser.add_argument(
        "--no-anchor", action="store_true", help="skip timing one geometry_proxies call at the --predict width"
    )
    parser.add_argument("--work", default=None, help="keep checkpoints and runs here (default: a temporary directory)")
    parser.add_argument("--plot", default=str(Path(__file__).with_name("locate_scaling.png")), help="PNG to write")
    parser.add_argument(
        "--no-results",
        action="store_true",
        help="print the tables only; do not write bench/results/locate_scaling.json",
    )
    parser.add_argument(
        "--plan-hours",
        action="store_true",
        help="print the 8B plan's hours (latest locate_scaling record, stated H100 assumptions) and exit",
    )
    args = parser.parse_args()
    if args.plan_hours:
        from _common import RESULTS_DIR, read_record

        print(plan_hours(read_record(RESULTS_DIR / "locate_scaling.json")))
        return
    args.predict = Shape(args.predict.layers, args.predict.width, args.predict_vocab)
    if "float64" not in args.precisions:
        args.precisions.insert(0, "float64")  # the collection run
    args.dihal = shutil.which("dihal") or str(Path(sys.executable).with_name("dihal"))

    load_before = loads()
    shapes = [Shape(args.layers, w) for w in args.widths] + list(args.extra)
    with tempfile.TemporaryDirectory(prefix="locate_scaling_") as tmp:
        work = Path(args.work or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        points = [measure(shape, args, work) for shape in shapes]
        check = check_run(args.check.resolve(), args, work) if args.check else None
        checks = {} if args.no_anchor else anchor(args, work)
    load_after, own_peak = loads(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    models = fit_models(points, args.precisions)
    time_table, time_rows = time_model_table(points, check, args.precisions)
    predicted = predict(models, args.predict, args.predict_tokens, args.precisions)
    plot(points, models, args.predict, predicted, args.precisions, checks, args.plot)
    setup = (
        f"load averages (1, 5, 15 min) before {load_before}, after {load_after}; children pinned to "
        f"{args.threads or 'the default number of'} thread(s); `dihal locate --max-tokens {args.max_tokens} "
        f"--seq-len {args.seq_len}` on the shipped corpus, repeats {DEFAULT_REPEATS} x sample "
        f"{DEFAULT_SAMPLE_SIZE}, float32 model; SwiGLU width {LLAMA_FFN_RATIO:.4g} x D; plot "
        f"below; peak RSS of the bench process {own_peak:.0f} MB (a floor of each child's)."
    )
    body = "\n\n".join(
        [
            setup,
            measured_table(points, args.precisions),
            fit_table(points, models, predicted, args.predict, args.precisions, checks),
            reading(args, models, predicted, checks),
            f"![locate cost against model size]({Path(args.plot).name})",
            TIME_MODEL,
            time_table,
        ]
    )
    targets = []
    if check is not None:
        error = check.predicted().total / check.measured().total - 1.0
        targets.append(
            target(
                f"the unit-cost time model predicts `dihal locate` on {check.name} within 25 %",
                f"{100 * error:+.0f} % ({check.predicted().total:.0f} predicted, {check.measured().total:.0f} "
                "measured CPU s)",
                abs(error) <= 0.25,
            )
        )
    if args.no_results:
        print(body)
    else:
        measured, fitted = markdown_tables(body)[:2]
        report(
            f"dihal locate cost against model size, extrapolated to {args.predict}",
            body,
            question="locate_scaling",
            figures={
                "runs": measured,
                "cost_models": fitted,
                "predicted": predicted,
                "anchor_cpu_s": checks,
                "predict": str(args.predict),
                "predict_tokens": args.predict_tokens,
                "time_model": {"rows": time_rows, "unit_costs": {str(p.shape): p.costs for p in points}}
                | (
                    {
                        "check": {
                            "model": str(args.check),
                            "unit_costs": check.costs,
                            "tokens": check.tokens,
                            "measured_cpu_s": vars(check.measured()),
                            "predicted_cpu_s": vars(check.predicted()),
                        }
                    }
                    if check
                    else {}
                ),
            },
            targets=targets,
        )


TIME_MODEL = (
    "**The time model, from unit costs** (no fitted constant): locate CPU s = load (imports and reading the weights, "
    "measured by a child that only loads the model) + tokens x (L x one decoder layer's forward + the rest of the "
    "forward + (L + 1) x one covariance update) + repeats x (L - 1) x one geometry_proxies call at n = sample size. "
    "The unit costs are measured on each run's own config.json in a child on the same pinned threads (float32, "
    "random weights and rows, `unit_costs`): a layer's forward as a 2-layer model minus a 1-layer one at the "
    "run's batch x sequence length, hidden states returned; one StreamingCovariance update of that many rows; one "
    "proxies call on the proxies bench's low-rank-plus-noise rows (bench_proxies.data). The GEMM column is the "
    "float32 rate of the layer's widest product "
    "(tokens x D times D x F), for comparison with the forward's flops. Measured / predicted; the load is measured "
    "once per model by the load-only child (the measured column is locate's CPU minus its collection and selection "
    "phases: imports, loading, the corpus, the report and plot)."
)


def reading(
    args: argparse.Namespace, models: dict[str, Model], predicted: dict[str, float], checks: dict[str, float]
) -> str:
    """The extrapolation in words: CPU hours of collection, minutes of selection, the peak's parts."""
    target, tokens = args.predict, args.predict_tokens
    reservoir = min(tokens, DEFAULT_REPEATS * DEFAULT_SAMPLE_SIZE)
    calls = selection_calls(target)
    flops_per_ld2 = 2 * (4 + 3 * LLAMA_FFN_RATIO) + 1  # forward GEMMs + the covariance update, per token
    selection = ", ".join(f"{q} {predicted[q] / 60:.1f}" for q in args.precisions)
    text = (
        f"EXTRAPOLATED to {target} (vocabulary {target.vocab}, {target.params / 1e9:.2f} B parameters, float32, "
        f"{args.threads or 'default'} thread(s)): collection {predicted['collect'] * 1e3:.0f} CPU ms per token "
        f"(the fitted slope is {flops_per_ld2 / models['collect'].b / 1e9:.0f} GFLOP/s at "
        f"{flops_per_ld2:.1f} flops per L D^2 per token), so "
        f"{tokens:,} tokens take {predicted['collect'] * tokens / 3600:.1f} CPU hours; selection "
        f"({calls} proxy calls at n = {DEFAULT_SAMPLE_SIZE}) {selection} CPU minutes; peak RSS "
        f"{predicted['peak'] / 2**30:.1f} GB, of which weights {4 * target.params / 2**30:.1f} GB, "
        "float64 covariances "
        f"{(target.layers + 1) * target.width**2 * 8 / 2**30:.1f} GB and the reservoir of {reservoir:,} tokens "
        f"{(target.layers + 1) * reservoir * target.width * 4 / 2**30:.1f} GB (raw bytes)."
    )
    if checks:
        direct = ", ".join(
            f"{q} {checks[q]:.2f} CPU s x {calls} = {checks[q] * calls / 60:.1f} CPU min"
            for q in args.precisions
            if q in checks
        )
        text += (
            f" Check of the selection's extrapolation: one geometry_proxies call on {DEFAULT_SAMPLE_SIZE} x "
            f"{target.width} random float32 rows measured directly: {direct}; where the two differ, trust "
            f"this one (the proxies take the n x n Gram route when D > n = {DEFAULT_SAMPLE_SIZE}, whose cost "
            "a flop model fitted on narrower models need not predict)."
        )
    return text


if __name__ == "__main__":
    main()
