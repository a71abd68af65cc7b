"""The locate stage: stream every layer's geometry out of a causal LM and pick the insertion layer l*.

``locate(LocateConfig(...), out)`` collects (one forward pass per batch, every hidden state streamed into an
exact covariance and a uniform token sample per layer; multi-process under torchrun), estimates the proxies
on repeated subsamples, scores the layers and writes ``out/locate.json`` and ``out/geometry.png``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dihal_fast.common.assets import backbone_option, corpus_option, corpus_or_default
from dihal_fast.common.checkpoint_config import check_checkpoint_config
from dihal_fast.common.devices import device_option, dtype_option
from dihal_fast.common.options import option
from dihal_fast.common.rundir import OVERWRITE_HELP
from dihal_fast.common.validation import CheckedConfig
from dihal_fast.errors import DihalValueError
from dihal_fast.geometry import BACKENDS
from dihal_fast.geometry.backends import PRECISIONS
from dihal_fast.pipeline.reports import LocateReport
from dihal_fast.select import DEFAULT_REPEATS, DEFAULT_SAMPLE_SIZE

if TYPE_CHECKING:
    from dihal_fast.collect import CollectConfig

logger = logging.getLogger(__name__)


@dataclass
class LocateConfig(CheckedConfig):
    """Model, corpus, collection and estimation settings of one locate run (errors name the ``dihal locate``
    flag of the field: ``sample_size`` is ``--sample-size``)."""

    model: str | None = backbone_option()
    corpus: list[str] | None = corpus_option()
    max_tokens: int | None = option(
        None, "tokens to read over all processes, in whole blocks (default: the whole corpus)", metavar="N", min=1
    )
    repeats: int = option(DEFAULT_REPEATS, "subsamples per layer for the proxies", min=1)
    sample_size: int = option(DEFAULT_SAMPLE_SIZE, "tokens per subsample (n)", min=2)
    reservoir_size: int | None = option(
        None, "tokens kept per layer for the subsamples (default: repeats x sample size)", metavar="N", min=1
    )
    k: int = option(16, "neighbours for the local curvature proxy", min=1)
    n_pairs: int = option(10000, "pairs for the monotonicity proxy", min=1)
    ridge: float = option(1e-3, "relative ridge of the monotonicity precision", gt=0.0)
    seq_len: int = option(128, "tokens per block (sequence length)", min=2)
    batch_size: int = option(8, "blocks per forward pass", min=1)
    layers: list[int] | None = option(
        None, "candidate hidden-state indices (default 1..L-1; 0 is the embedding output)", metavar="L"
    )
    keep_first: bool = option(False, "keep the first position of each block (attention sink)")
    resume: bool = option(False, "continue the collection checkpointed in the run directory")
    overwrite: bool = option(False, OVERWRITE_HELP)
    checkpoint_every: int = option(100, "batches between checkpoints", min=1)
    max_batches: int | None = option(
        None,
        "stop after this many batches of this call (checkpointed; `dihal locate` "
        "exits with status 3; continue with --resume)",
        metavar="N",
        min=1,
    )
    save_shards: bool = option(False, "also write the sampled vectors per layer to RUN/shards")
    keep_checkpoints: bool = option(
        False,
        "keep the collection checkpoint (RUN/collect, GBs on a real model) when the run completes; by default it is "
        "removed then (a --resume of the finished run collects again)",
    )
    dtype: str = dtype_option(
        help="model dtype (hidden states keep it): auto (the checkpoint's own), float32, bfloat16, float16 or float64"
    )
    device: str = device_option()
    backend: str = option("auto", "geometry kernel backend for the proxies", choices=BACKENDS)
    precision: str = option(
        "float64",
        "products of the proxies: float64 (exact) or float32 (faster on CPU, error far "
        "below the spread between repeats; see dihal_fast.geometry_proxies)",
        choices=PRECISIONS,
    )
    seed: int = option(0, "seed of the token sample, the subsamples and the pairs")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layers is not None and len(set(self.layers)) < 2:
            raise DihalValueError(f"--layers {self.layers}: the selection compares at least 2 candidate layers")
        if self.backend != "auto":  # a backend this machine cannot run is refused now, not after the collection
            from dihal_fast.geometry.backends import get_backend

            get_backend(self.backend, "cuda" if self.backend in ("cuda", "cuvs") else "cpu")


def locate(config: LocateConfig, out: str | Path) -> LocateReport:
    """Run (or, with ``config.resume``, continue) locate into run directory ``out``, holding its lock.

    Under torchrun every process calls this; rank 0 writes the report and returns it.
    """
    from dihal_fast.collect import distributed_session
    from dihal_fast.common import resolve_device
    from dihal_fast.common.rundir import RESUME_HINT, run_directory

    device = str(resolve_device(config.device))
    with (
        run_directory(out, "dihal locate", resume=config.resume, overwrite=config.overwrite, resume_hint=RESUME_HINT),
        distributed_session(device) as (rank, world),
    ):
        check_checkpoint_config(config.model, config.seq_len)  # a bad config.json, a too long --seq-len
        return _locate(config, Path(out), device, rank, world)


def _candidate_layers(model_dir: Path, layers: list[int] | None) -> tuple[list[int], int, int]:
    """The candidate layers, the model's number of layers and its width."""
    from transformers import AutoConfig

    try:
        model_config = AutoConfig.from_pretrained(model_dir)
        n_layers, width = model_config.num_hidden_layers, int(model_config.hidden_size)
    except Exception as exc:  # transformers raises several types for an unusable config
        raise DihalValueError(f"could not read the model config in {model_dir}: {type(exc).__name__}: {exc}") from None
    if not isinstance(n_layers, int) or n_layers < 3:
        raise DihalValueError(
            f"{model_dir}/config.json: need num_hidden_layers >= 3 to compare layers 1..L-1, got {n_layers!r}"
        )
    if layers is None:
        return list(range(1, n_layers)), n_layers, width
    bad = [l for l in layers if not 1 <= l <= n_layers - 1]
    if bad:
        raise DihalValueError(
            f"--layers {bad} out of range: candidates are hidden-state indices 1..{n_layers - 1} "
            f"(0 is the embedding output, {n_layers} the final normed output)"
        )
    return sorted(set(layers)), n_layers, width


def _selection_bytes(sample_size: int, width: int) -> int:
    """The memory the selection adds after the collection (measured): the proxies of one layer's subsample, about
    two float64 copies of its ``sample_size x width`` values and 16 MB, then the plot's 32 MB (matplotlib)."""
    return 2 * sample_size * width * 8 + 48 * 2**20


def _saved_reservoir_size(out: Path, resume: bool) -> int | None:
    """On ``--resume`` without ``--reservoir-size``: the size the run was started with (so that a
    changed ``--repeats``/``--sample-size`` only changes the selection, not the collection)."""
    from dihal_fast.common import read_json

    path = out / "collect" / "config.json"
    if not (resume and path.is_file()):
        return None
    saved = read_json(path, "collection config")
    return saved.get("reservoir_size") if isinstance(saved, dict) else None


def _check_sizes(cfg: LocateConfig, reservoir_size: int) -> None:
    if cfg.sample_size > reservoir_size:
        raise DihalValueError(f"--sample-size {cfg.sample_size} exceeds --reservoir-size {reservoir_size}")
    if not cfg.k < cfg.sample_size:
        raise DihalValueError(f"--k {cfg.k} must be smaller than --sample-size {cfg.sample_size}")
    if cfg.max_tokens is not None:
        usable = (cfg.max_tokens // cfg.seq_len) * (cfg.seq_len - (0 if cfg.keep_first else 1))
        if cfg.sample_size > usable:
            raise DihalValueError(
                f"--sample-size {cfg.sample_size} exceeds the {usable} tokens that --max-tokens "
                f"{cfg.max_tokens} yields (blocks of {cfg.seq_len}, first position excluded)"
            )


def _stream_geometry(statistics) -> list[dict]:
    """Full-stream facts per hidden state: exact k_eff, trace and mean norm from the streamed covariance."""
    from dihal_fast.geometry.backends import get_backend

    ops = get_backend("auto")
    rows = []
    for layer, cov in statistics.covariances.items():
        sigma = cov.covariance
        trace = float(np.trace(sigma))
        top = ops.top_eigenvalue(sigma) if trace > 0 else 0.0
        rows.append(
            {
                "layer": layer,
                "k_eff": trace / top if top > 0 else None,
                "trace": trace,
                "mean_norm": float(np.linalg.norm(cov.mean)),
            }
        )
    return rows


def _corpus_provenance(config: CollectConfig) -> dict:
    """The tokens each corpus file gave the collected blocks (``corpus_tokens``, counted again from the corpus:
    every rank's blocks) and the documents' special tokens (``documents``)."""
    from dihal_fast.common.hf_loading import load_tokenizer
    from dihal_fast.corpus import corpus_token_counts, read_texts, token_convention

    tokenizer = load_tokenizer(config.model)
    texts = read_texts(config.corpus)
    return {
        "corpus_tokens": corpus_token_counts(tokenizer, texts, config.seq_len, config.max_tokens),
        "documents": token_convention(tokenizer).describe(),
    }


def _locate(cfg: LocateConfig, out: Path, device: str, rank: int, world: int) -> LocateReport:
    """Collect, estimate, select, and (on rank 0) write the report and the plot."""
    from dihal_fast.collect import CollectConfig, collect, remove_collection_state, write_shards
    from dihal_fast.common import atomic_write_json
    from dihal_fast.common.devices import dtype_name
    from dihal_fast.common.hf_loading import resolve_model_dir
    from dihal_fast.select import estimate_geometry, plot_geometry

    start = time.perf_counter()
    model_dir = resolve_model_dir(cfg.model)
    candidates, n_layers, width = _candidate_layers(model_dir, cfg.layers)
    reservoir_size = cfg.reservoir_size or _saved_reservoir_size(out, cfg.resume) or cfg.repeats * cfg.sample_size
    _check_sizes(cfg, reservoir_size)
    config = CollectConfig(
        model=str(model_dir.resolve()),
        corpus=[str(Path(p).resolve()) for p in corpus_or_default(cfg.corpus)],
        seq_len=cfg.seq_len,
        batch_size=cfg.batch_size,
        max_tokens=cfg.max_tokens,
        reservoir_size=reservoir_size,
        keep_first=cfg.keep_first,
        dtype=dtype_name(cfg.dtype, model_dir),
        seed=cfg.seed,
        world_size=world,
        device=device,
        checkpoint_every=cfg.checkpoint_every,
        layers=None if cfg.layers is None else candidates,  # only the candidates; by default every hidden state
    )
    selection = _selection_bytes(cfg.sample_size, width)
    result = collect(config, out, resume=cfg.resume, max_batches=cfg.max_batches, selection=selection)
    if not result.complete:
        logger.info("collection stopped after %d blocks; rerun with --resume to continue", result.n_blocks)
        return LocateReport(out, complete=False)
    available = min(result.n_tokens, reservoir_size)
    if cfg.sample_size > available:
        raise DihalValueError(
            f"--sample-size {cfg.sample_size} exceeds the {result.n_tokens} tokens collected "
            f"({result.n_blocks} blocks); lower it or collect more tokens"
        )
    if rank != 0:
        return LocateReport(out)
    reservoir = result.statistics.reservoir.sorted()
    meta = {"model": config.model, "corpus": config.corpus, "seed": config.seed, "seq_len": config.seq_len}
    if cfg.save_shards:
        write_shards(reservoir, out / "shards", meta)
    select_start = time.perf_counter()
    estimate = estimate_geometry(
        {l: reservoir.layer_vectors(l) for l in candidates},
        candidates,
        repeats=cfg.repeats,
        sample_size=cfg.sample_size,
        k=cfg.k,
        ridge=cfg.ridge,
        n_pairs=cfg.n_pairs,
        seed=cfg.seed,
        backend=cfg.backend,
        precision=cfg.precision,
        progress=True,
    )
    select_s = time.perf_counter() - select_start
    best = estimate.selected_layer
    summary = estimate.summary()
    plot_geometry(estimate, out / "geometry.png", title=f"{Path(config.model).name}: selected layer {best}")
    timings = {**result.timings, "select_s": select_s, "total_s": time.perf_counter() - start}
    report = {
        "model": config.model,
        "corpus": config.corpus,
        **_corpus_provenance(config),
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
    if not cfg.keep_checkpoints:
        freed = remove_collection_state(out)
        logger.info("removed the collection checkpoint (%.1f MB; --keep-checkpoints keeps it)", freed / 2**20)
    logger.info(
        "selected layer %d (score %.3f); wrote %s and %s",
        best,
        report["selected_score"]["mean"],
        out / "locate.json",
        out / "geometry.png",
    )
    return LocateReport(out, report)
