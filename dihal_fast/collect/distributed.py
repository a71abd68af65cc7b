"""torch.distributed plumbing for collection: session set-up, agreement on errors, tree merge.

Ranks never talk during collection; at the end they agree on errors and totals (``all_reduce``)
and the statistics are merged pairwise up a binary tree to rank 0 (``log2(world)`` rounds, two
states in memory at a time) with :meth:`LayerStatistics.merge`, i.e. the count-weighted
pairwise covariance update and the bottom-k reservoir merge.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from dihal_fast.collect.statistics import LayerStatistics
from dihal_fast.common.launch import DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT, launcher_env
from dihal_fast.errors import DihalValueError

logger = logging.getLogger(__name__)


def rank_info() -> tuple[int, int]:
    """``(rank, world_size)``: ``(0, 1)`` when no process group is initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def local_device(device: str) -> str:
    """``device`` with the local rank's GPU index when running several processes on CUDA."""
    if device == "cuda" and rank_info()[1] > 1:
        return f"cuda:{launcher_env().local_rank}"
    return device


@contextlib.contextmanager
def distributed_session(device: str = "cpu") -> Iterator[tuple[int, int]]:
    """Join the process group when launched with several processes (torchrun, the deepspeed launcher or
    ``srun``: :func:`~dihal_fast.common.launch.launcher_env`).

    gloo on CPU, nccl on CUDA; ``MASTER_ADDR``/``MASTER_PORT`` default to ``127.0.0.1:29500`` when
    launched by hand with ``RANK``/``WORLD_SIZE`` set. Always ends with ``barrier()`` and
    ``destroy_process_group()``. A single process runs without a process group.
    """
    launch = launcher_env()  # torchrun / deepspeed / srun variables (see dihal_fast.common.launch)
    world = launch.world_size
    if world <= 1 or dist.is_initialized():
        yield rank_info()
        return
    os.environ.setdefault("MASTER_ADDR", DEFAULT_MASTER_ADDR)
    os.environ.setdefault("MASTER_PORT", str(DEFAULT_MASTER_PORT))
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(launch.local_rank)
    dist.init_process_group(backend)
    logger.info(
        "joined process group: rank %d of %d (%s, launched by %s)", dist.get_rank(), world, backend, launch.launcher
    )
    try:
        yield rank_info()
    finally:
        dist.barrier()
        dist.destroy_process_group()


def _comm_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_ints(values: list[int], op: str = "sum") -> list[int]:
    """Element-wise ``sum``/``min``/``max`` of integers over ranks (identity for one process)."""
    if rank_info()[1] == 1:
        return list(values)
    ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    tensor = torch.tensor(values, dtype=torch.int64, device=_comm_device())
    dist.all_reduce(tensor, op=ops[op])
    return [int(v) for v in tensor.cpu()]


def agree_on_errors(error: BaseException | None) -> None:
    """Raise on every rank if any rank failed (the failing rank re-raises its own error)."""
    failed = all_reduce_ints([int(error is not None)], "max")[0]
    if error is not None:
        raise error
    if failed:
        raise DihalValueError("collection failed on another process; see that process's error message")


def _send_state(state: dict[str, torch.Tensor], dst: int) -> None:
    """Send a dict of tensors: a JSON header (names, dtypes, shapes) as bytes, then each tensor's data."""
    device = _comm_device()
    names = sorted(state)
    header = json.dumps([[n, str(state[n].dtype).replace("torch.", ""), list(state[n].shape)] for n in names]).encode()
    dist.send(torch.tensor([len(header)], dtype=torch.int64, device=device), dst)
    dist.send(torch.frombuffer(bytearray(header), dtype=torch.uint8).to(device), dst)
    for name in names:
        if state[name].numel():
            dist.send(state[name].contiguous().to(device), dst)


def _recv_state(src: int) -> dict[str, torch.Tensor]:
    """Receive what :func:`_send_state` sent, on the host."""
    device = _comm_device()
    length = torch.zeros(1, dtype=torch.int64, device=device)
    dist.recv(length, src)
    header = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    dist.recv(header, src)
    state = {}
    for name, dtype, shape in json.loads(header.cpu().numpy().tobytes()):
        tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        if tensor.numel():
            dist.recv(tensor, src)
        state[name] = tensor.cpu()
    return state


def merge_to_rank0(stats: LayerStatistics, make_empty: Callable[[], LayerStatistics]) -> LayerStatistics | None:
    """Tree-merge every rank's statistics into rank 0's; returns them on rank 0 and ``None`` elsewhere."""
    rank, world = rank_info()
    step = 1
    while step < world:
        if rank % (2 * step):
            _send_state(stats.state_dict(), rank - step)
            return None
        if rank + step < world:
            stats.merge(make_empty().load_state_dict(_recv_state(rank + step)))
        step *= 2
    return stats
