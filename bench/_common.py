"""Shared benchmark plumbing: timing, the machine's GEMM rate, markdown tables, and the result records.

Every bench script ends with ``report(title, body, question=..., figures=..., targets=...)``: it prints
the body and writes ``bench/results/<question>.json`` (overwritten by each run: the latest figures are
the current ones, the history stays in git). ``python bench/render_results.py`` regenerates
``bench/README.md`` from those records. ``DIHAL_BENCH_RESULTS=DIR`` sends a trial run's record elsewhere.

A question answered by several runs (seeds, variants) is one merged record with a ``runs`` table; each row names
the record its command wrote (``"record"``), and the merged record keeps that run's figures under the same name.
``report`` writes a rerun of such a command to ``unmerged/`` beside the records instead of over the merged one,
and ``merge_run`` (``python bench/render_results.py --merge``) folds it in.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS_DIR = Path(os.environ.get("DIHAL_BENCH_RESULTS", BENCH / "results"))  # elsewhere for a trial run
REQUIRED = ("question", "title", "command", "commit", "machine", "date", "figures", "targets", "body")
STATUSES = ("met", "missed", "reported")
NOT_RECORDED = "not recorded"
RUN_FIELDS = ("run", "record", "command", "commit", "date", "machine")  # one row of a merged record's runs
UNMERGED = "unmerged"  # the folder, inside the results folder, for reruns of runs that a merged record holds


def best_time(
    fn: Callable[[], object], repeat: int = 3, warmup: int = 1, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Best time of ``repeat`` calls after ``warmup`` calls (seconds of ``clock``: wall by default,
    ``time.process_time`` for this process's CPU seconds, the figure a shared machine's load does not enter)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)


def cpu_seconds(fn: Callable[[], object]) -> float:
    """Process CPU seconds of one call."""
    return best_time(fn, repeat=1, warmup=0, clock=time.process_time)


def gemm_rates(width: int, rows: int = 256) -> dict[str, float]:
    """GFLOP per CPU-second of a (rows x width) @ (width x width) matrix product in float32 and bfloat16 on one
    thread, best of 3."""
    import torch

    torch.set_num_threads(1)
    rates = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(rows, width, dtype=dtype), torch.randn(width, width, dtype=dtype)
        best = best_time(lambda a=a, b=b: a @ b, clock=time.process_time)
        rates[str(dtype).replace("torch.", "")] = 2 * rows * width * width / best / 1e9
    return rates


def sgemm_rate(size: int = 3072) -> float:
    """The machine's float32 matrix-multiply rate (GFLOP/s): best of NumPy and torch, same threads."""
    import torch

    rng = np.random.default_rng(0)
    A = rng.standard_normal((size, size), dtype=np.float32)
    B = rng.standard_normal((size, size), dtype=np.float32)
    tA, tB = torch.from_numpy(A), torch.from_numpy(B)
    flops = 2.0 * size**3
    return max(flops / best_time(lambda: A @ B) / 1e9, flops / best_time(lambda: tA @ tB) / 1e9)


@dataclass
class SweepRun:
    """What one ``dihal sweep`` cost (its own and its worker processes' resources, from ``wait4``) and its
    layers' validation bridge losses."""

    wall_s: float
    user_s: float
    sys_s: float
    minor_faults: int
    max_rss_mb: float
    losses: dict[str, float]


def run_sweep(args: Sequence[str], out: Path, **env: str) -> SweepRun:
    """``dihal sweep ARGS --out OUT`` with the environment variables ``env`` (glibc ``MALLOC_*`` and the
    ``DIHAL_MALLOC`` / ``DIHAL_NUM_THREADS`` / ``OMP_NUM_THREADS`` of this process removed first)."""
    dihal = shutil.which("dihal") or str(Path(sys.executable).with_name("dihal"))
    drop = ("MALLOC_", "DIHAL_MALLOC", "DIHAL_NUM_THREADS", "OMP_NUM_THREADS")
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(drop)} | env
    start = time.perf_counter()
    child = subprocess.Popen(
        [dihal, "sweep", *args, "--out", str(out)], env=child_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"dihal sweep failed: {child.stderr.read().decode()[-2000:]}")
    sweep = json.loads((out / "sweep.json").read_text())
    losses = {str(row["layer"]): row["bridge_loss"] for row in sweep["layers"]}
    return SweepRun(wall, usage.ru_utime, usage.ru_stime, usage.ru_minflt, usage.ru_maxrss / 1024, losses)


def machine() -> str:
    """One line naming the machine the numbers come from."""
    import torch

    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}"


def table(header: list[str], rows: list[list[object]]) -> str:
    """A markdown table."""

    def fmt(v: object) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def rows_figure(header: Sequence[str], rows: Sequence[Sequence[object]]) -> dict[str, list]:
    """A table as structured figures for a record: ``{"columns": [...], "rows": [[...], ...]}``."""
    return {"columns": list(header), "rows": [list(row) for row in rows]}


def _cell(text: str) -> object:
    """A table cell as a number where it reads as one (bold marks dropped), else the text."""
    value = text.strip().replace("**", "")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+|-?\d+", value):
        return int(value.replace(",", ""))
    try:
        return float(value)
    except ValueError:
        return value


def markdown_tables(text: str) -> list[dict[str, list]]:
    """Every markdown table in ``text`` as a ``rows_figure``, in order: the figures of a body built as markdown."""
    found, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append([cell for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif block:
            found.append(rows_figure([c.strip() for c in block[0]], [[_cell(c) for c in row] for row in block[2:]]))
            block = []
    return found


def target(text: str, measured: object, met: bool | None) -> dict[str, str]:
    """One stated target: its text, the measured value, and ``met``/``missed`` (``None``: reported only)."""
    status = "reported" if met is None else ("met" if met else "missed")
    return {"target": text, "measured": str(measured), "status": status}


def command_line() -> str:
    """The exact command of this run, the script's path relative to the repository root."""
    script = Path(sys.argv[0]).resolve()
    shown = os.path.relpath(script, REPO) if script.is_relative_to(REPO) else str(script)
    return "python " + " ".join(shlex.quote(a) for a in [shown] + sys.argv[1:])


def commit() -> str:
    """``git rev-parse HEAD``, with ``+dirty`` when tracked code (package, kernels, bench) differs from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        dirty = git(
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            "dihal_fast",
            "csrc",
            "bench",
            ":(exclude)bench/results",
            ":(exclude)bench/README.md",
        )
    except (OSError, subprocess.CalledProcessError):
        return NOT_RECORDED
    return head + ("+dirty" if dirty else "")


def add_rehearsal_options(parser: argparse.ArgumentParser) -> None:
    """``--models`` (bench/make_rehearsal_model.py's ``--out``) and ``--shapes``: the rehearsal benches' inputs."""
    parser.add_argument("--models", type=Path, required=True, help="make_rehearsal_model.py's --out")
    parser.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "llama-1b"], help="rehearsal shapes")


def add_hybrid_options(parser: argparse.ArgumentParser, work: str) -> None:
    """``--hybrid`` / ``--work`` / ``--steps`` of a bench that measures a layer-1 hybrid of the shipped backbone."""
    parser.add_argument("--hybrid", help="a hybrid directory of the shipped backbone (default: train one in --work)")
    parser.add_argument("--work", default=work, help="where the layer-1 hybrid is trained")
    parser.add_argument("--steps", type=int, default=300, help="bridge training steps when training the hybrid")


def add_real_model_options(parser: argparse.ArgumentParser) -> None:
    """``--model`` / ``--layer`` / ``--val-blocks`` / ``--corpus`` / ``--val-corpus`` / ``--work`` of a bench that
    trains bridges of a real model: SmolLM2-135M unless ``--model`` names another (:func:`real_model`)."""
    add_model_option(parser)
    parser.add_argument("--layer", type=int, default=3, help="hidden state l* (SmolLM2's selected layer: 3)")
    parser.add_argument("--val-blocks", type=int, default=32)
    parser.add_argument("--corpus", type=Path, nargs="+", required=True)
    parser.add_argument("--val-corpus", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True, help="run directories and the model cache")


def add_model_option(parser: argparse.ArgumentParser) -> None:
    """``--model``: the real checkpoint a bench uses, read by :func:`real_model`."""
    parser.add_argument("--model", type=Path, default=None, help="the checkpoint (default: SmolLM2-135M's GGUF)")


def add_target_scaling_option(parser: argparse.ArgumentParser) -> None:
    """``--target-scaling``: passed to every ``dihal replace`` of the bench (:func:`target_scaling_argv`)."""
    from dihal_fast.replace.config import TARGET_SCALINGS

    parser.add_argument(
        "--target-scaling", choices=TARGET_SCALINGS, default=None, help="dihal replace's option (default: its default)"
    )


def target_scaling_argv(args: argparse.Namespace) -> tuple[str, ...]:
    """``dihal replace``'s ``--target-scaling`` option from the bench's (none: replace's default)."""
    return ("--target-scaling", args.target_scaling) if args.target_scaling else ()


def run_target_scaling(out: Path) -> str:
    """The target scaling the ``dihal replace`` run in ``out`` trained with, ``auto`` resolved by its copied layers
    (a run from before the option: scalar)."""
    from dihal_fast.replace import BridgeTrainConfig

    option = json.loads((out / "train_config.json").read_text()).get("target_scaling", "scalar")
    copied = json.loads((out / "bridge_config.json").read_text())["copied_layers"]
    return BridgeTrainConfig(target_scaling=option).scaling_for(copied)


def real_model(args: argparse.Namespace) -> Path:
    """``--model``, or SmolLM2-135M-Instruct's GGUF file fetched once into ``WORK/models``."""
    from dihal_fast.testing.real_models import smollm2_checkpoint

    return args.model or smollm2_checkpoint(args.work / "models")


def dihal_one_thread(*argv: str) -> None:
    """``dihal ARGV`` in its own process on one thread (the real-model benches' runs and their CPU-second budgets)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "DIHAL_NUM_THREADS": "1"}
    command = [sys.executable, "-c", "import sys; from dihal_fast.cli import main; sys.exit(main())", *argv]
    subprocess.run(command, check=True, env=env)


def real_model_replace(model: Path, args: argparse.Namespace, out: Path, *options: str) -> None:
    """``dihal replace`` of ``model`` at ``--layer`` on ``--corpus`` / ``--val-corpus`` (:func:`add_real_model_options`)
    into ``out`` with ``options``, in its own process on one thread, CPU-second budget; resumed when ``out`` holds a
    checkpoint (a run killed in an earlier session continues)."""
    resume = ["--resume"] if (out / "checkpoints").is_dir() else []
    dihal_one_thread(
        "replace", "--model", str(model), "--layer", str(args.layer), "--budget-clock", "cpu",
        "--val-blocks", str(args.val_blocks), "--corpus", *map(str, args.corpus), "--val-corpus", str(args.val_corpus),
        "--out", str(out), *options, *resume,
    )  # fmt: skip


def hybrid_from_options(args: argparse.Namespace) -> str:
    """``--hybrid``, or the layer-1 hybrid of the shipped backbone trained (or reused) in ``--work``."""
    if args.hybrid is not None:
        return args.hybrid
    from dihal_fast.pipeline import ReplaceConfig, replace
    from dihal_fast.replace import BridgeTrainConfig

    return str(replace(ReplaceConfig(layer=1, train=BridgeTrainConfig(steps=args.steps)), args.work).hybrid_dir)


def question_key(title: str) -> str:
    """A record key for callers that name no question: the title's words, lower case, joined by ``_``."""
    return "_".join(re.findall(r"[a-z0-9]+", title.lower()))[:60] or "untitled"


def jsonable(value: Any) -> Any:
    """``value`` with NumPy scalars/arrays, tuples and paths made JSON types; non-finite floats as strings."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"figure value {value!r} of type {type(value).__name__} is not a number, string, list or dict")


def validate(record: Mapping[str, Any], where: str) -> None:
    """Raise ValueError (TypeError for non-dict figures) naming ``where`` unless ``record`` has every field,
    non-empty, with known statuses."""
    missing = [key for key in REQUIRED if key not in record]
    if missing:
        raise ValueError(f"{where}: record lacks {', '.join(missing)} (expected fields: {', '.join(REQUIRED)})")
    empty = [
        key
        for key in ("question", "title", "command", "commit", "machine", "date", "body")
        if not isinstance(record[key], str) or not record[key].strip()
    ]
    if empty:
        raise ValueError(f"{where}: {', '.join(empty)} must be non-empty strings (use {NOT_RECORDED!r} when unknown)")
    if not isinstance(record["figures"], dict):
        raise TypeError(f"{where}: figures must be a dict, got {type(record['figures']).__name__}")
    for item in record["targets"]:
        if set(item) != {"target", "measured", "status"} or item["status"] not in STATUSES:
            raise ValueError(f"{where}: target {item!r} needs target/measured/status with status in {STATUSES}")
    for run in record.get("runs") or ():
        if not isinstance(run, dict) or set(run) != set(RUN_FIELDS):
            raise ValueError(f"{where}: run {run!r} needs the fields {', '.join(RUN_FIELDS)}")


def write_record(record: Mapping[str, Any], results_dir: Path | None = None) -> Path:
    """Write ``record`` to ``<results_dir>/<question>.json`` (replacing the previous run's); return the path."""
    record = jsonable(record)
    validate(record, f"record {record.get('question')!r}")
    directory = RESULTS_DIR if results_dir is None else results_dir
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{record['question']}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
    tmp.replace(path)
    return path


def read_record(path: Path) -> dict[str, Any]:
    """One record, checked: ValueError naming the file when it is not valid JSON or lacks a field."""
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    validate(record, str(path))
    if record["question"] != path.stem:
        raise ValueError(f"{path}: question {record['question']!r} does not match the file name")
    return record


def merged_into(question: str, results_dir: Path | None = None) -> str | None:
    """The key of the merged record under ``results_dir`` holding a run that wrote ``question`` (None: none)."""
    directory = RESULTS_DIR if results_dir is None else results_dir
    for path in sorted(directory.glob("*.json")):
        try:
            runs = json.loads(path.read_text()).get("runs") or ()
        except (OSError, json.JSONDecodeError, AttributeError):
            continue  # read_record names a broken record when the document is rendered
        if any(isinstance(run, dict) and run.get("record") == question for run in runs):
            return path.stem
    return None


def merge_run(path: Path, into: str, run: str | None = None, results_dir: Path | None = None) -> Path:
    """Fold the one-run record at ``path`` into the merged record ``into``; return the merged record's path.

    The run's figures go under the key it wrote; its row of the runs table (the row that wrote the same key, or
    the row named ``run``, else a new row named ``run``) takes its command, commit, date and machine; the
    merged record's date spans its runs; the file at ``path`` is removed. The merged body's tables and its
    targets are text written from the figures: they are not recomputed (edit them, then re-render).
    """
    directory = RESULTS_DIR if results_dir is None else results_dir
    new = read_record(Path(path))
    merged = read_record(directory / f"{into}.json")
    if new.get("runs"):
        raise ValueError(f"{path}: a merged record itself; --merge takes the record of one run")
    if not merged.get("runs"):
        raise ValueError(f"{directory / f'{into}.json'}: a record of one run (no runs table) takes no merge")
    rows = merged["runs"]
    found = [i for i, row in enumerate(rows) if (row["run"] == run if run else row["record"] == new["question"])]
    if not found and run is None:
        raise ValueError(f"no run of {into} wrote {new['question']!r}: pass --run NAME to add it as a new row")
    row = {"run": rows[found[0]]["run"] if found else run, "record": new["question"]}
    row |= {field: new[field] for field in ("command", "commit", "date", "machine")}
    if found:
        rows[found[0]] = row
    else:
        rows.append(row)
    merged["figures"][new["question"]] = new["figures"]
    dates = sorted(r["date"] for r in rows)
    merged["date"] = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    written = write_record(merged, directory)
    if Path(path).resolve() != written.resolve():
        Path(path).unlink()
    return written


def report(
    title: str,
    body: str,
    *,
    question: str | None = None,
    figures: Mapping[str, Any] | None = None,
    targets: Sequence[Mapping[str, str]] = (),
    results_dir: Path | None = None,
) -> Path:
    """Print ``body`` and write it as the latest record of ``question`` with the command, commit and machine.

    ``figures`` holds the numbers as data (scalars and ``rows_figure`` tables), ``targets`` the stated
    targets (``target(...)``). Without ``question`` the key is derived from ``title``. A key that a merged
    record's run wrote goes to ``unmerged/`` inside the results folder, never over the merged record.
    """
    directory = RESULTS_DIR if results_dir is None else results_dir
    key = question or question_key(title)
    into = merged_into(key, directory)
    record = {
        "question": key,
        "title": title,
        "command": command_line(),
        "commit": commit(),
        "machine": machine(),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "figures": dict(figures or {}),
        "targets": [dict(t) for t in targets],
        "body": body.strip(),
    }
    path = write_record(record, directory / UNMERGED if into else directory)
    print(
        f"\n## {title}\n\n`{record['command']}` ({record['date']}; {record['machine']}; {record['commit']})\n\n{body}\n"
    )
    if into:
        print(
            f"record: {path}: {key} is a run of the merged record {into}; fold it in with "
            f"python bench/render_results.py --merge {path} --into {into}"
        )
    else:
        print(f"record: {path}  (re-render bench/README.md: python bench/render_results.py)")
    return path
