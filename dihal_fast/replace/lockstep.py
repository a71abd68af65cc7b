"""Bridges for several layers of one backbone trained together (the layer sweep): one teacher forward pass per
batch serves every layer, instead of one per layer.

``train_bridges(model_dir, layers, corpus, out_dirs, config)`` gives each layer exactly the run, files and numbers
that :func:`~dihal_fast.replace.train_bridge` (``resume=True``) gives it alone: the same batches (their order
depends only on the seed and the step), the same initialisation (the seed is set before each bridge is built),
the same diffusion noise (drawn per step) and the same teacher targets (one deterministic forward pass of the
frozen backbone, whose ``h_l`` and logits do not depend on which layers are read). The backbone and the corpus
blocks are loaded once; the layers step in turn (:func:`~dihal_fast.train.trainer.fit_lockstep`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path

from torch import Tensor, nn

from dihal_fast.common.hf_loading import load_causal_lm
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
            raise ValueError(f"need at least one layer and a capacity >= 1, got {list(layers)} and {capacity}")
        self.backbone, self.layers, self.capacity = backbone, sorted(set(layers)), capacity
        self._cache: OrderedDict[tuple, tuple[dict[int, Tensor], Tensor]] = OrderedDict()
        self.passes = 0  # forward passes run (a test and the sweep's log read it)

    def __call__(self, input_ids: Tensor, layer: int) -> tuple[Tensor, Tensor]:
        if layer not in self.layers:
            raise ValueError(f"layer {layer} is not one of this teacher's layers {self.layers}")
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


def train_bridges(
    model_dir: str | os.PathLike | None,
    layers: Sequence[int],
    corpus: str | os.PathLike | Sequence[str | os.PathLike],
    out_dirs: Mapping[int, str | os.PathLike],
    config: BridgeTrainConfig | None = None,
) -> dict[int, dict]:
    """Train (or resume) the bridge of each of ``layers`` in ``out_dirs[layer]``, all with ``config``, sharing the
    teacher's forward passes; ``{layer: summary}`` as :func:`~dihal_fast.replace.train_bridge` returns it. One
    process, plain torch (the sweep's setting)."""
    config = config or BridgeTrainConfig()
    layers = list(dict.fromkeys(layers))
    if not layers or set(layers) - set(out_dirs):
        raise ValueError(f"need a run directory for each of the layers {layers}, got {sorted(out_dirs)}")
    checkpoints = {}
    for layer in layers:  # every check before any weights load
        model_path, resolved, _, checkpoints[layer] = _preflight(
            model_dir, layer, corpus, Path(out_dirs[layer]), config, None, True, "none"
        )
    config = resolved
    with training_session(None, config.loop_settings()) as (rank, _, device):
        backbone, tokenizer = load_causal_lm(model_path, config.dtype, device)
        backbone.requires_grad_(False)
        blocks = load_blocks(tokenizer, corpus, config.seq_len, config.val_blocks, config.max_train_tokens)
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
        runs = fit_lockstep(
            [(jobs[layer], out_dirs[layer], checkpoints[layer]) for layer in layers],
            desc=f"bridges of layers {layers[0]}..{layers[-1]}" if len(layers) > 1 else f"bridge layer {layers[0]}",
        )
        results = {layer: jobs[layer].finish(run, run.elapsed_s - run.resumed_s) for layer, run in zip(layers, runs)}
    logger.info("%d teacher forward passes for %d layers", teacher.passes, len(layers))
    return results
