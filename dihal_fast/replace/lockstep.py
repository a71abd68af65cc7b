"""Bridges for several layers of one backbone trained together (the layer sweep): one teacher forward pass per
batch serves every layer, instead of one per layer.

``train_bridges(model_dir, layers, corpus, out_dirs, config)`` gives each layer exactly the run, files and numbers
that :func:`~dihal_fast.replace.train_bridge` (``resume=True``) gives it alone: the same batches (their order
depends only on the seed and the step), the same initialisation (the seed is set before each bridge is built),
the same diffusion noise (drawn per step) and the same teacher targets (one deterministic forward pass of the
frozen backbone, whose ``h_l`` and logits do not depend on which layers are read). The backbone and the corpus
blocks are loaded once; the layers step in turn (:func:`~dihal_fast.train.trainer.fit_lockstep`).

On a CPU with several free cores, ``workers=N`` trains the layers in ``N`` one-thread processes instead, each its
share of the layers together (:func:`split_layers` balances the layers above each one): at the small widths of a
sweep one thread per process uses the cores better than threads in one process, and each layer's run is still
the one it gets alone with one thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor, nn

from dihal_fast.common.devices import resolve_device
from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.common.rundir import die_with_parent, register_writers
from dihal_fast.errors import DihalValueError
from dihal_fast.hybrid import backbone_targets
from dihal_fast.hybrid.slicing import tap_hidden_state
from dihal_fast.replace.config import BridgeTrainConfig
from dihal_fast.replace.data import load_blocks
from dihal_fast.replace.job import _preflight, bridge_job
from dihal_fast.train.trainer import fit_lockstep, training_session

logger = logging.getLogger(__name__)


class SharedTeacher:
    """``(input_ids, layer) -> (h_layer, logits)`` as :func:`~dihal_fast.hybrid.backbone_targets` gives them, from
    one forward pass per distinct batch that records every one of ``layers``; the ``capacity`` most recent batches
    are kept (the statistics blocks, then each training step, then the validation blocks are asked for by each
    layer in turn)."""

    def __init__(self, backbone: nn.Module, layers: Sequence[int], capacity: int):
        if not layers or capacity < 1:
            raise DihalValueError(f"need at least one layer and a capacity >= 1, got {list(layers)} and {capacity}")
        self.backbone, self.layers, self.capacity = backbone, sorted(set(layers)), capacity
        self._cache: OrderedDict[tuple, tuple[dict[int, Tensor], Tensor]] = OrderedDict()
        self.passes = 0  # forward passes run (a test and the sweep's log read it)

    def __call__(self, input_ids: Tensor, layer: int) -> tuple[Tensor, Tensor]:
        if layer not in self.layers:
            raise DihalValueError(f"layer {layer} is not one of this teacher's layers {self.layers}")
        key = (tuple(input_ids.shape), str(input_ids.device), input_ids.cpu().numpy().tobytes())
        if key in self._cache:
            self._cache.move_to_end(key)
        else:
            self._cache[key] = self._forward(input_ids)
            if len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        hidden, logits = self._cache[key]
        return hidden[layer], logits

    def _forward(self, input_ids: Tensor) -> tuple[dict[int, Tensor], Tensor]:
        """``backbone_targets`` of the first layer, with the other layers' outputs recorded on the same pass."""
        first, *others = self.layers
        with contextlib.ExitStack() as stack:
            taps = {layer: stack.enter_context(tap_hidden_state(self.backbone, layer)) for layer in others}
            hidden, logits = backbone_targets(self.backbone, input_ids, first)
        self.passes += 1
        return {first: hidden, **{layer: taps[layer][-1].to(input_ids.device) for layer in others}}, logits


@dataclass(frozen=True)
class LayerRuns:
    """The bridge runs of one :func:`train_bridges` call (what a worker process is handed): the checkpoint (as
    given, a path once :meth:`preflight` resolved it), the layers in order, the corpus, each layer's run
    directory and the training config."""

    model_path: str | os.PathLike | None
    layers: list[int]
    corpus: str | os.PathLike | Sequence[str | os.PathLike]
    out_dirs: Mapping[int, str | os.PathLike]
    config: BridgeTrainConfig

    def subset(self, layers: list[int]) -> LayerRuns:
        return dataclasses.replace(self, layers=layers, out_dirs={layer: self.out_dirs[layer] for layer in layers})

    def preflight(self) -> tuple[LayerRuns, dict[int, Path | None]]:
        """Every check of every layer's run before any weights load: the runs with the resolved config, and
        each layer's checkpoint to resume from."""
        checkpoints = {}
        for layer in self.layers:
            model_path, config, _, checkpoints[layer] = _preflight(
                self.model_path, layer, self.corpus, Path(self.out_dirs[layer]), self.config, None, True, "none"
            )
        return dataclasses.replace(self, model_path=model_path, config=config), checkpoints


def train_bridges(
    model_dir: str | os.PathLike | None,
    layers: Sequence[int],
    corpus: str | os.PathLike | Sequence[str | os.PathLike],
    out_dirs: Mapping[int, str | os.PathLike],
    config: BridgeTrainConfig | None = None,
    workers: int = 1,
) -> dict[int, dict]:
    """Train (or resume) the bridge of each of ``layers`` in ``out_dirs[layer]``, all with ``config``, sharing the
    teacher's forward passes; ``{layer: summary}`` as :func:`~dihal_fast.replace.train_bridge` returns it. Plain
    torch (the sweep's setting): one process, or with ``workers > 1`` (CPU only) that many processes of one
    thread each, every one training its share of the layers (:func:`split_layers`) together. Each layer's run is
    the same either way at the same thread count (a GEMM's sums, and so the last bits, can depend on it)."""
    layers = list(dict.fromkeys(layers))
    if not layers or set(layers) - set(out_dirs):
        raise DihalValueError(f"need a run directory for each of the layers {layers}, got {sorted(out_dirs)}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise DihalValueError(f"workers must be a positive integer, got {workers!r}")
    runs, checkpoints = LayerRuns(model_dir, layers, corpus, dict(out_dirs), config or BridgeTrainConfig()).preflight()
    if workers > 1 and len(layers) > 1:
        if resolve_device(runs.config.device).type != "cpu":
            raise DihalValueError(f"workers > 1 trains on the CPU only; this run's device is {runs.config.device!r}")
        return _train_in_workers(runs, checkpoints, workers)
    return _train_together(runs, checkpoints)


def _train_together(
    runs: LayerRuns, checkpoints: Mapping[int, Path | None], position: int | None = None
) -> dict[int, dict]:
    """One process: load the backbone and blocks once, step every layer's bridge in turn (progress bar at
    ``position``)."""
    config, layers, out_dirs = runs.config, runs.layers, runs.out_dirs
    assert runs.model_path is not None, "preflight resolves the checkpoint first"
    model_path = Path(runs.model_path)
    with training_session(None, config.loop_settings()) as (rank, _, device):
        backbone, tokenizer = load_causal_lm(model_path, config.dtype, device)
        backbone.requires_grad_(False)
        blocks = load_blocks(tokenizer, runs.corpus, config.seq_len, config.val_blocks, config.max_train_tokens)
        batches = max(-(-min(config.stats_blocks, blocks.train.shape[0]) // config.batch_size), 1)
        teacher = SharedTeacher(backbone, layers, capacity=max(batches, -(-config.val_blocks // config.batch_size)))
        jobs = {
            layer: bridge_job(
                backbone,
                tokenizer,
                model_path,
                blocks,
                layer,
                Path(out_dirs[layer]),
                config,
                checkpoints[layer],
                device,
                rank,
                teacher=teacher,
            )
            for layer in layers
        }
        trained = fit_lockstep(
            [(jobs[layer], out_dirs[layer], checkpoints[layer]) for layer in layers],
            desc=f"bridges of layers {', '.join(map(str, layers))}" if len(layers) > 1 else f"bridge layer {layers[0]}",
            position=position,
        )
        results = {layer: jobs[layer].finish(run, run.elapsed_s - run.resumed_s) for layer, run in zip(layers, trained)}
    logger.info("%d teacher forward passes for %d layers", teacher.passes, len(layers))
    return results


def split_layers(layers: Sequence[int], workers: int, backbone_layers: int) -> list[list[int]]:
    """``layers`` in at most ``workers`` groups of about equal cost, each in increasing order: a layer-``l`` bridge
    step runs the ``backbone_layers - l`` layers above it forward and back, plus about two layers' worth for
    the bridge, the teacher's share and the head (the shallowest, dearest cut first, each to the group with the
    least cost so far)."""
    groups: list[list[int]] = [[] for _ in range(min(workers, len(layers)))]
    cost = [0] * len(groups)
    for layer in sorted(layers):
        i = cost.index(min(cost))
        groups[i].append(layer)
        cost[i] += backbone_layers - layer + 2
    return [sorted(group) for group in groups]


def _train_in_workers(runs: LayerRuns, checkpoints: Mapping[int, Path | None], workers: int) -> dict[int, dict]:
    """:func:`_train_together` of each :func:`split_layers` group in its own one-thread process (spawned: no
    OpenMP pool is forked), with the runs and checkpoints this process checked (it holds their directories)."""
    from transformers import AutoConfig

    from dihal_fast import cpu_malloc

    groups = split_layers(runs.layers, workers, AutoConfig.from_pretrained(runs.model_path).num_hidden_layers)
    logger.info("%d worker processes of one thread, layers %s", len(groups), groups)
    level, tuned_malloc = logging.getLogger().getEffectiveLevel(), cpu_malloc.applied()
    results: dict[int, dict] = {}
    pool = ProcessPoolExecutor(
        len(groups),
        mp_context=multiprocessing.get_context("spawn"),
        initializer=die_with_parent,
        initargs=(os.getpid(),),
    )
    try:
        futures = [
            pool.submit(
                _worker, i, runs.subset(group), {layer: checkpoints[layer] for layer in group}, level, tuned_malloc
            )
            for i, group in enumerate(groups)
        ]
        _register_workers(pool, runs)
        for future in futures:
            results.update(future.result())
    except BrokenProcessPool:
        _stop_workers(pool)
        raise ChildProcessError(
            "a sweep worker process died (killed, or out of memory?); rerun to resume from the last checkpoints"
        ) from None
    except BaseException:  # an interrupt (Ctrl-C, SIGTERM) or a worker's error: no worker may keep writing
        _stop_workers(pool)
        raise
    pool.shutdown(wait=True)
    return {layer: results[layer] for layer in runs.layers}


def _register_workers(pool: ProcessPoolExecutor, runs: LayerRuns) -> None:
    """Record the workers in the lock of each layer's run directory, where this process holds it."""
    pids = [process.pid for process in (pool._processes or {}).values() if process.pid]  # noqa: SLF001
    for layer in runs.layers:
        with contextlib.suppress(KeyError):  # a caller that does not hold the layer's directory
            register_writers(runs.out_dirs[layer], pids)


def _stop_workers(pool: ProcessPoolExecutor, grace_s: float = 30.0) -> None:
    """Stop the pool's workers (an interrupt or an error left them training): SIGTERM, which stops a training
    worker as it stops ``dihal replace`` (the step in progress finishes and each of its layers' runs is checkpointed;
    every write is atomic), repeated until they are gone (an idle worker ends at the first), SIGKILL after
    ``grace_s``; then shut the pool down."""
    processes = list((pool._processes or {}).values())  # noqa: SLF001  (the pool keeps no public handle)
    deadline = time.monotonic() + grace_s
    while (alive := [process for process in processes if process.is_alive()]) and time.monotonic() < deadline:
        for process in alive:
            process.terminate()
        time.sleep(0.2)
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join()
    pool.shutdown(wait=True, cancel_futures=True)


def _worker(
    index: int, runs: LayerRuns, checkpoints: Mapping[int, Path | None], log_level: int, tuned_malloc: bool
) -> dict[int, dict]:
    """One worker process: one thread, the parent's log level and allocator setting, writes only below its layers'
    run directories."""
    import torch

    from dihal_fast.common.io import run_root
    from dihal_fast.cpu_malloc import configure_malloc

    if tuned_malloc:
        configure_malloc()
    torch.set_num_threads(1)
    logging.basicConfig(
        level=log_level, format=f"%(asctime)s %(levelname)s worker {index} %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    with contextlib.ExitStack() as roots:
        for layer in runs.layers:
            roots.enter_context(run_root(runs.out_dirs[layer], record=True))
        return _train_together(runs, checkpoints, position=index)
