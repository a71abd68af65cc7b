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
from _common import markdown_tables, report, table
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
    ]
    locate = run_child(base + ["--precision", "float64"], env, work)
    result = json.loads((run / "locate.json").read_text())
    select_cpu = {"float64": result["timings"]["select_s"] * locate.cpu_share("collect", "proxies:")}
    for precision in args.precisions:
        if precision != "float64":
            rerun = run_child(base + ["--resume", "--precision", precision], env, work)
            seconds = json.loads((run / "locate.json").read_text())["timings"]["select_s"]
            select_cpu[precision] = seconds * rerun.cpu_share("collecting", "proxies:")
    if args.work is None:
        shutil.rmtree(model)
        shutil.rmtree(run)
    point = Point(shape, locate, load, result, select_cpu)
    print(
        f"{shape}: {point.tokens} tokens, collect {point.collect_cpu:.1f} CPU s, select "
        + ", ".join(f"{p} {s:.1f}" for p, s in select_cpu.items())
        + f" CPU s, total {locate.wall_s:.1f} s wall / {locate.cpu_s:.1f} s CPU, "
        f"peak {locate.peak_bytes / 2**20:.0f} MB, "
        f"other processes {locate.other_cores:.2f} cores",
        flush=True,
    )
    return point


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
    args = parser.parse_args()
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
        checks = {} if args.no_anchor else anchor(args, work)
    load_after, own_peak = loads(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    models = fit_models(points, args.precisions)
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
        ]
    )
    if args.no_results:
        print(body)
    else:
        measured, fitted = markdown_tables(body)
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
            },
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
