"""The collection pass: one forward per batch, every hidden state into :class:`LayerStatistics`."""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dihal_fast.collect.config import CollectConfig
from dihal_fast.collect.distributed import agree_on_errors, all_reduce_ints, local_device, merge_to_rank0, rank_info
from dihal_fast.collect.memory import estimate_memory, resident_bytes
from dihal_fast.collect.state_store import CheckpointStore
from dihal_fast.collect.statistics import LayerStatistics, token_mask
from dihal_fast.common.hf_loading import DTYPES, load_causal_lm
from dihal_fast.common.progress import progress_bar
from dihal_fast.corpus import iter_token_blocks, read_texts
from dihal_fast.errors import DihalValueError
from dihal_fast.hybrid.slicing import decoder_layers, hidden_states_up_to
from dihal_fast.profiling import nvtx_range

logger = logging.getLogger(__name__)


@dataclass
class CollectResult:
    """Outcome of :func:`collect`. ``statistics`` is the merged state on rank 0 (``None`` elsewhere
    or when the pass stopped early); ``complete`` is False when ``max_batches`` stopped it."""

    statistics: LayerStatistics | None
    complete: bool
    n_blocks: int
    n_tokens: int
    n_layers: int
    hidden_size: int
    timings: dict[str, float] = field(default_factory=dict)


def model_hidden_states(
    backbone: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    states: Sequence[int] | None = None,
) -> Sequence[torch.Tensor] | Mapping[int, torch.Tensor]:
    """Hidden states of one batch by index (0 the embedding output, ``L`` the final normed output), without the LM
    head: all ``L + 1``, or where ``states`` lie in ``1..L-1`` only those, from a pass that stops after the deepest
    of them (the layers above it never run)."""
    with torch.no_grad():
        if states and _blocks_to_hook(backbone, states) is not None:
            return hidden_states_up_to(backbone, input_ids, states, attention_mask)
        out = backbone(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
    return out.hidden_states


def _blocks_to_hook(backbone: torch.nn.Module, states: Sequence[int] | None) -> torch.nn.ModuleList | None:
    """The decoder blocks whose outputs are ``states`` when they all lie in ``1..L-1`` (``None``: a whole pass)."""
    if not states or min(states) < 1 or max(states) >= backbone.config.num_hidden_layers:
        return None
    try:
        return decoder_layers(backbone)
    except DihalValueError:  # a family the hybrid cannot cut
        return None


def _check_model(model, config: CollectConfig) -> tuple[int, int]:
    n_layers, hidden = int(model.config.num_hidden_layers), int(model.config.hidden_size)
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None and config.seq_len > max_positions:
        raise DihalValueError(f"seq_len {config.seq_len} exceeds the model's max_position_embeddings ({max_positions})")
    return n_layers, hidden


def _rank_blocks(tokenizer, config: CollectConfig, rank: int, world: int, skip: int) -> Iterator[torch.Tensor]:
    """This rank's blocks (global blocks ``rank, rank + world, ...``) after the first ``skip``."""
    total = config.total_blocks
    if total is not None and total <= rank:
        return iter(())
    blocks = iter_token_blocks(tokenizer, read_texts(config.corpus), config.seq_len, config.max_tokens, rank, world)
    return itertools.islice(blocks, skip, None)


def _collected_states(config: CollectConfig, n_layers: int) -> list[int]:
    """The hidden-state indices ``config`` collects (every one, ``0..L``, by default)."""
    if config.layers is None:
        return list(range(n_layers + 1))
    if config.layers[-1] > n_layers:
        raise DihalValueError(f"layers {config.layers}: the model has hidden states 0..{n_layers} only")
    return list(config.layers)


def _check_memory(
    config: CollectConfig, model: torch.nn.Module, before_load: int, states: list[int], selection: int
) -> None:
    """Log the peak memory of the collection and refuse, in one line, one larger than this machine's memory."""
    blocks = _blocks_to_hook(model.base_model, states)
    unread = None if blocks is None else list(blocks[states[-1] :])
    estimate = estimate_memory(model, before_load, config, len(states), unread, selection)
    logger.info(
        "collecting %d hidden states (dim %d) from %s on %s, a reservoir of %d tokens: %s",
        len(states),
        model.config.hidden_size,
        config.model,
        model.device,
        config.reservoir_size,
        estimate.describe(),
    )
    available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if estimate.peak > available:
        raise DihalValueError(
            f"collecting needs {estimate.peak / 2**30:.1f} GiB of memory (the reservoir "
            f"{estimate.reservoir / 2**30:.1f} GiB: --reservoir-size {config.reservoir_size} tokens x {len(states)} "
            "hidden states), more than the "
            f"{available / 2**30:.1f} GiB of this machine; lower --reservoir-size or collect fewer --layers"
        )


def _collect_local(
    config: CollectConfig, run_dir: Path, resume: bool, max_batches: int | None, progress: bool, selection: int
):
    rank, world = rank_info()
    device = local_device(config.device)
    before_load = resident_bytes()
    model, tokenizer = load_causal_lm(config.model, config.dtype, device)
    n_layers, hidden = _check_model(model, config)
    states = _collected_states(config, n_layers)
    _check_memory(config, model, before_load, states, selection if rank == 0 else 0)
    store = CheckpointStore(run_dir, rank, world)
    store.start(config, resume)
    stats = LayerStatistics(states, hidden, config.reservoir_size, DTYPES[config.dtype], config.seed)
    state = {"blocks_done": 0, "batches_done": 0, "exhausted": False}
    if resume:
        state = store.load(stats, config, model.get_input_embeddings().num_embeddings) or state
    total = config.total_blocks
    expected = None if total is None else -(-len(range(rank, total, world)) // config.batch_size)
    start = time.perf_counter()
    with progress_bar(
        total=expected, initial=state["batches_done"], unit="batch", desc="collect", disable=not progress or rank != 0
    ) as bar:
        if not state["exhausted"]:
            blocks = _rank_blocks(tokenizer, config, rank, world, state["blocks_done"])
            _run_batches(model, blocks, stats, store, state, config, max_batches, bar)
    store.save(stats, state)
    return stats, state, n_layers, hidden, time.perf_counter() - start


def _run_batches(
    model,
    blocks,
    stats: LayerStatistics,
    store: CheckpointStore,
    state: dict,
    config: CollectConfig,
    max_batches: int | None,
    bar,
) -> None:
    """Forward batches of blocks into ``stats`` until the blocks run out or ``max_batches``; updates ``state``."""
    rank, world = rank_info()
    device = model.device
    vocab = model.get_input_embeddings().num_embeddings
    offsets = torch.arange(config.seq_len, device=device)
    for _ in itertools.count() if max_batches is None else range(max_batches):
        batch = list(itertools.islice(blocks, config.batch_size))
        if not batch:
            state["exhausted"] = True
            return
        input_ids = torch.stack(batch).to(device)
        if int(input_ids.max()) >= vocab:
            raise DihalValueError(
                f"the tokenizer produced id {int(input_ids.max())} but the model has only {vocab} embeddings"
            )
        local = torch.arange(state["blocks_done"], state["blocks_done"] + len(batch), device=device)
        positions = (local * world + rank)[:, None] * config.seq_len + offsets
        attention = torch.ones_like(input_ids)
        with nvtx_range("collect"):
            hidden_states = model_hidden_states(model.base_model, input_ids, attention, stats.layers)
            stats.update(hidden_states, token_mask(attention, config.keep_first), positions, input_ids)
        del hidden_states
        state["blocks_done"] += len(batch)
        state["batches_done"] += 1
        bar.update(1)
        bar.set_postfix(tokens=stats.count)
        if state["batches_done"] % config.checkpoint_every == 0:
            store.save(stats, state)


def collect(
    config: CollectConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    max_batches: int | None = None,
    progress: bool = True,
    selection: int = 0,
) -> CollectResult:
    """Stream ``config.corpus`` through ``config.model`` into per-layer statistics, checkpointed in ``RUN/collect``.

    Every process (``torchrun``) reads its share of blocks; ranks agree on errors, then their states
    are merged to rank 0. ``max_batches`` stops this invocation after that many batches (state
    checkpointed; ``resume=True`` continues and yields the same result as one uninterrupted pass).
    ``selection``: the bytes rank 0 needs afterwards for the proxies of the sample, counted in the logged and
    checked memory peak (:mod:`dihal_fast.collect.memory`).
    Raises ``ValueError`` when the corpus yields no block or fewer tokens than ``max_tokens``.
    """
    rank, world = rank_info()
    if config.world_size != world:
        raise DihalValueError(f"config.world_size is {config.world_size} but {world} process(es) are running")
    try:
        stats, state, n_layers, hidden, seconds = _collect_local(
            config, Path(run_dir), resume, max_batches, progress, selection
        )
        error = None
    except Exception as exc:  # every rank must reach the agreement below, or the others would hang
        error = exc
    agree_on_errors(error)
    n_blocks, complete_ranks, n_tokens = all_reduce_ints([state["blocks_done"], int(state["exhausted"]), stats.count])
    complete = complete_ranks == world
    timings = {"collect_s": seconds}
    if not complete:
        logger.info("stopped after %d blocks (max_batches=%s); continue with resume", n_blocks, max_batches)
        return CollectResult(None, False, n_blocks, n_tokens, n_layers, hidden, timings)
    _check_totals(config, n_blocks)
    start = time.perf_counter()
    merged = merge_to_rank0(
        stats, lambda: LayerStatistics(stats.layers, hidden, config.reservoir_size, stats.reservoir.dtype, config.seed)
    )
    timings["merge_s"] = time.perf_counter() - start
    return CollectResult(merged, True, n_blocks, n_tokens, n_layers, hidden, timings)


def _check_totals(config: CollectConfig, n_blocks: int) -> None:
    if n_blocks == 0:
        raise DihalValueError(f"corpus {config.corpus} yields no full block of seq_len = {config.seq_len} tokens")
    wanted = config.total_blocks
    if wanted is not None and n_blocks < wanted:
        raise DihalValueError(
            f"corpus {config.corpus} yields only {n_blocks * config.seq_len} tokens ({n_blocks} blocks of "
            f"{config.seq_len}) but max_tokens = {config.max_tokens} were requested; lower --max-tokens or add text"
        )
