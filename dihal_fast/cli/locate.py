"""``dihal locate``: stream every layer's geometry out of a causal LM and pick the insertion layer l*."""
from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

EXIT_STOPPED = 3  # --max-batches stopped the pass; rerun with --resume


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except ``None`` ones (their help says what unset means)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return action.help if action.default is None else super()._get_help_string(action)


def register(subparsers: argparse._SubParsersAction) -> None:
    from dihal_fast.common.models import DTYPES
    from dihal_fast.geometry import BACKENDS
    from dihal_fast.geometry.backends import PRECISIONS
    from dihal_fast.select import DEFAULT_REPEATS, DEFAULT_SAMPLE_SIZE

    parser = subparsers.add_parser(
        "locate",
        help="measure the geometry proxies at every layer and select the insertion layer l*",
        description=(
            "Run a causal LM over a corpus (one forward pass per batch, every hidden state streamed into an "
            "exact covariance and a uniform token sample per layer), estimate m_curv, m_mono and k_eff per "
            "layer on repeated subsamples, z-score them into the selection score and pick l* = argmax. "
            "Writes RUN/locate.json and RUN/geometry.png; checkpoints in RUN/collect. Multi-process: "
            "torchrun --nproc_per_node N $(which dihal) locate ..."
        ),
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--model", default=None, metavar="DIR", help="local Hugging Face causal-LM checkpoint directory (default: the shipped backbone)")
    parser.add_argument("--corpus", nargs="+", default=None, metavar="PATH",
                        help=".txt / .jsonl files, directories of them or a saved dataset (default: the shipped corpus)")
    parser.add_argument("--out", required=True, metavar="RUN", help="run directory for the report, the plot and the checkpoints")
    parser.add_argument("--max-tokens", type=int, default=None, metavar="N",
                        help="tokens to read over all processes, in whole blocks (default: the whole corpus)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="subsamples per layer for the proxies")
    parser.add_argument("--sample-size", type=int, default=DEFAULT_SAMPLE_SIZE, help="tokens per subsample (n)")
    parser.add_argument("--reservoir-size", type=int, default=None, metavar="N",
                        help="tokens kept per layer for the subsamples (default: repeats x sample size)")
    parser.add_argument("--k", type=int, default=16, help="neighbours for the local curvature proxy")
    parser.add_argument("--n-pairs", type=int, default=10000, help="pairs for the monotonicity proxy")
    parser.add_argument("--ridge", type=float, default=1e-3, help="relative ridge of the monotonicity precision")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per block (sequence length)")
    parser.add_argument("--batch-size", type=int, default=8, help="blocks per forward pass")
    parser.add_argument("--layers", type=int, nargs="+", default=None, metavar="L",
                        help="candidate hidden-state indices (default 1..L-1; 0 is the embedding output)")
    parser.add_argument("--keep-first", action="store_true", help="keep the first position of each block (attention sink)")
    parser.add_argument("--resume", action="store_true", help="continue the collection checkpointed in --out")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="batches between checkpoints")
    parser.add_argument("--max-batches", type=int, default=None, metavar="N",
                        help=f"stop after this many batches of this invocation (checkpointed, exit status {EXIT_STOPPED}; continue with --resume)")
    parser.add_argument("--save-shards", action="store_true", help="also write the sampled vectors per layer to RUN/shards")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="model dtype (hidden states keep it)")
    parser.add_argument("--device", default="auto", help="torch device for the model: auto (cuda if present), cpu, cuda, cuda:1")
    parser.add_argument("--backend", default="auto", choices=BACKENDS, help="geometry kernel backend for the proxies")
    parser.add_argument("--precision", default="float64", choices=PRECISIONS,
                        help="products of the proxies: float64 (exact) or float32 (faster on CPU, error far below "
                             "the spread between repeats; see dihal_fast.geometry_proxies)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the token sample, the subsamples and the pairs")
    parser.set_defaults(func=run)


def _corpus(paths: list[str] | None) -> list[str]:
    if paths:
        return [str(Path(p).resolve()) for p in paths]
    from dihal_fast import backbone

    if not hasattr(backbone, "default_corpus"):
        raise ValueError("no --corpus given and this installation ships no default corpus; pass --corpus PATH")
    default = backbone.default_corpus()
    return [str(p) for p in (default if isinstance(default, (list, tuple)) else [default])]


def _candidate_layers(model_dir: Path, layers: list[int] | None) -> tuple[list[int], int]:
    from transformers import AutoConfig

    try:
        n_layers = AutoConfig.from_pretrained(model_dir).num_hidden_layers
    except Exception as exc:  # transformers raises several types for an unusable config
        raise ValueError(f"could not read the model config in {model_dir}: {type(exc).__name__}: {exc}") from None
    if not isinstance(n_layers, int) or n_layers < 3:
        raise ValueError(f"{model_dir}/config.json: need num_hidden_layers >= 3 to compare layers 1..L-1, got {n_layers!r}")
    if layers is None:
        return list(range(1, n_layers)), n_layers
    bad = [l for l in layers if not 1 <= l <= n_layers - 1]
    if bad:
        raise ValueError(f"--layers {bad} out of range: candidates are hidden-state indices 1..{n_layers - 1} "
                         f"(0 is the embedding output, {n_layers} the final normed output)")
    return sorted(set(layers)), n_layers


def _saved_reservoir_size(out: Path, resume: bool) -> int | None:
    """On ``--resume`` without ``--reservoir-size``: the size the run was started with (so that a
    changed ``--repeats``/``--sample-size`` only changes the selection, not the collection)."""
    from dihal_fast.common import read_json

    path = out / "collect" / "config.json"
    if not (resume and path.is_file()):
        return None
    saved = read_json(path, "collection config")
    return saved.get("reservoir_size") if isinstance(saved, dict) else None


def _check_sizes(args: argparse.Namespace, reservoir_size: int) -> None:
    for name in ("repeats", "sample_size", "k", "n_pairs", "seq_len", "batch_size", "checkpoint_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.sample_size > reservoir_size:
        raise ValueError(f"--sample-size {args.sample_size} exceeds --reservoir-size {reservoir_size}")
    if not args.k < args.sample_size:
        raise ValueError(f"--k {args.k} must be smaller than --sample-size {args.sample_size}")
    if args.max_tokens is not None:
        usable = (args.max_tokens // args.seq_len) * (args.seq_len - (0 if args.keep_first else 1))
        if args.sample_size > usable:
            raise ValueError(f"--sample-size {args.sample_size} exceeds the {usable} tokens that --max-tokens "
                             f"{args.max_tokens} yields (blocks of {args.seq_len}, first position excluded)")


def _stream_geometry(statistics) -> list[dict]:
    """Full-stream facts per hidden state: exact k_eff, trace and mean norm from the streamed covariance."""
    from dihal_fast.geometry.backends import get_backend

    ops = get_backend("auto")
    rows = []
    for layer, cov in statistics.covariances.items():
        sigma = cov.covariance
        trace = float(np.trace(sigma))
        top = ops.top_eigenvalue(sigma) if trace > 0 else 0.0
        rows.append({"layer": layer, "k_eff": trace / top if top > 0 else None, "trace": trace,
                     "mean_norm": float(np.linalg.norm(cov.mean))})
    return rows


def run(args: argparse.Namespace) -> int:
    from dihal_fast.collect import distributed_session
    from dihal_fast.common import resolve_device
    from dihal_fast.common.rundir import run_directory

    device = str(resolve_device(args.device))
    with run_directory(args.out, "dihal locate"), distributed_session(device) as (rank, world):
        return locate(args, device, rank, world)


def locate(args: argparse.Namespace, device: str, rank: int, world: int) -> int:
    """Collect, estimate, select, and (on rank 0) write the report and the plot."""
    from dihal_fast.collect import CollectConfig, collect, write_shards
    from dihal_fast.common import atomic_write_json
    from dihal_fast.common.models import resolve_model_dir
    from dihal_fast.select import estimate_geometry, plot_geometry

    start = time.perf_counter()
    out = Path(args.out)
    model_dir = resolve_model_dir(args.model)
    candidates, n_layers = _candidate_layers(model_dir, args.layers)
    reservoir_size = args.reservoir_size or _saved_reservoir_size(out, args.resume) or args.repeats * args.sample_size
    _check_sizes(args, reservoir_size)
    config = CollectConfig(
        model=str(model_dir.resolve()), corpus=_corpus(args.corpus), seq_len=args.seq_len, batch_size=args.batch_size,
        max_tokens=args.max_tokens, reservoir_size=reservoir_size, keep_first=args.keep_first, dtype=args.dtype,
        seed=args.seed, world_size=world, device=device, checkpoint_every=args.checkpoint_every,
    )
    result = collect(config, out, resume=args.resume, max_batches=args.max_batches)
    if not result.complete:
        logger.info("collection stopped after %d blocks; rerun with --resume to continue", result.n_blocks)
        return EXIT_STOPPED
    available = min(result.n_tokens, reservoir_size)
    if args.sample_size > available:
        raise ValueError(f"--sample-size {args.sample_size} exceeds the {result.n_tokens} tokens collected "
                         f"({result.n_blocks} blocks); lower it or collect more tokens")
    if rank != 0:
        return 0
    reservoir = result.statistics.reservoir.sorted()
    meta = {"model": config.model, "corpus": config.corpus, "seed": config.seed, "seq_len": config.seq_len}
    if args.save_shards:
        write_shards(reservoir, out / "shards", meta)
    select_start = time.perf_counter()
    estimate = estimate_geometry(
        {l: reservoir.layer_vectors(l) for l in candidates}, candidates, repeats=args.repeats,
        sample_size=args.sample_size, k=args.k, ridge=args.ridge, n_pairs=args.n_pairs, seed=args.seed,
        backend=args.backend, precision=args.precision, progress=True,
    )
    select_s = time.perf_counter() - select_start
    best = estimate.selected_layer
    summary = estimate.summary()
    plot_geometry(estimate, out / "geometry.png", title=f"{Path(config.model).name}: selected layer {best}")
    timings = {**result.timings, "select_s": select_s, "total_s": time.perf_counter() - start}
    report = {
        "model": config.model,
        "corpus": config.corpus,
        "n_tokens": result.n_tokens,
        "n_blocks": result.n_blocks,
        "n_layers": n_layers,
        "hidden_size": result.hidden_size,
        "candidate_layers": candidates,
        "layers": summary,
        "selected_layer": best,
        "selected_score": next(row["score"] for row in summary if row["layer"] == best),
        "per_repeat": {name: values.tolist() for name, values in estimate.values.items()},
        "stream": _stream_geometry(result.statistics),
        "config": {"collect": config.to_dict(), "select": estimate.config, "world_size": world},
        "timings": timings,
    }
    atomic_write_json(out / "locate.json", report)
    logger.info("selected layer %d (score %.3f); wrote %s and %s", best, report["selected_score"]["mean"],
                out / "locate.json", out / "geometry.png")
    print(f"selected layer {best}  (report: {out / 'locate.json'}, plot: {out / 'geometry.png'})")
    return 0
