"""What the cluster launchers tell a process about its place in a job, read in one place.

``torchrun`` and the ``deepspeed`` launcher set ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` (``deepspeed`` and the old ``torch.distributed.launch`` also pass ``--local_rank=N``, which
the ``dihal`` parser accepts on every sub-command and turns into ``LOCAL_RANK``). ``srun`` without torchrun
sets only SLURM's variables: :func:`launcher_env` maps ``SLURM_PROCID`` / ``SLURM_LOCALID`` /
``SLURM_STEP_NUM_TASKS`` (else ``SLURM_NTASKS``) onto ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE``, takes
``MASTER_ADDR`` from the first host of ``SLURM_JOB_NODELIST`` and a ``MASTER_PORT`` derived from
``SLURM_JOB_ID``. Variables already set always win, so torchrun inside an sbatch script is left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from dihal_fast.errors import DihalValueError

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500
TORCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class LaunchInfo:
    """This process's place in the job: global rank, rank on its node, number of processes, who launched it."""

    rank: int
    local_rank: int
    world_size: int
    launcher: str  # "torchrun" (RANK/WORLD_SIZE set by any torch-style launcher), "slurm" or "none"


def _integer(env: Mapping[str, str], name: str, minimum: int) -> int | None:
    value = env.get(name)
    if value is None or value == "":
        return None
    if not value.strip().isdigit() or int(value) < minimum:
        raise DihalValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``node[01-04,07],gpu2`` -> ``node01``.

    Uses ``scontrol show hostnames`` when it is on PATH (it knows every form SLURM writes), else parses
    the common ``prefix[a-b,c]suffix`` form itself.
    """
    nodelist = nodelist.strip()
    if not nodelist:
        raise DihalValueError("SLURM_JOB_NODELIST is empty; set MASTER_ADDR to the first node's address")
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True, timeout=30
            ).stdout.split()
        except (OSError, subprocess.SubprocessError):
            out = []
        if out:
            return out[0]
    return expand_nodelist(nodelist)[0]


def expand_nodelist(nodelist: str) -> list[str]:
    """All hosts of a SLURM node list in its ``prefix[01-04,07]suffix`` form (several groups, comma-separated).

    Zero padding of a range is kept (``n[08-10]`` -> ``n08 n09 n10``); nested or multiple bracket groups
    per host name are refused with a message naming ``scontrol show hostnames``.
    """
    hosts: list[str] = []
    for item in _split_top_level(nodelist):
        match = re.fullmatch(r"([^\[\],]*)(?:\[([^\[\]]*)\])?([^\[\],]*)", item)
        if match is None or not item:
            raise DihalValueError(
                f"cannot parse SLURM node list {nodelist!r} (item {item!r}); set MASTER_ADDR, or put scontrol on PATH"
            )
        prefix, ranges, suffix = match.groups()
        if ranges is None:
            hosts.append(item)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not low.isdigit() or (high and not high.isdigit()) or (high and int(high) < int(low)):
                raise DihalValueError(
                    f"cannot parse the range {part!r} of SLURM node list {nodelist!r}; set MASTER_ADDR"
                )
            width = len(low)
            hosts.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(low), int(high or low) + 1))
    if not hosts:
        raise DihalValueError(f"SLURM node list {nodelist!r} names no host; set MASTER_ADDR")
    return hosts


def _split_top_level(nodelist: str) -> list[str]:
    """``a[1-2,5],b`` -> ``["a[1-2,5]", "b"]``: the commas outside brackets separate host groups."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise DihalValueError(f"unbalanced or nested brackets in SLURM node list {nodelist!r}; set MASTER_ADDR")
        if char == "," and depth == 0:
            items.append(nodelist[start:i])
            start = i + 1
    if depth:
        raise DihalValueError(f"unbalanced brackets in SLURM node list {nodelist!r}; set MASTER_ADDR")
    return [*items, nodelist[start:]]


def slurm_master_port(env: Mapping[str, str]) -> int:
    """A port in 15000..34999 derived from ``SLURM_JOB_ID`` (two jobs sharing a node do not collide), else 29500."""
    job = env.get("SLURM_JOB_ID", "")
    return 15000 + int(job) % 20000 if job.isdigit() else DEFAULT_MASTER_PORT


def launcher_env(env: MutableMapping[str, str] | None = None) -> LaunchInfo:
    """Fill the torch variables from SLURM's when ``srun`` launched this process without torchrun, check
    them, and return this process's :class:`LaunchInfo`. ``env`` defaults to ``os.environ`` (changed in place).

    Inconsistent values (``RANK`` >= ``WORLD_SIZE``, ``WORLD_SIZE`` > 1 without ``RANK``) are a ValueError
    naming the launcher command to use.
    """
    env = os.environ if env is None else env
    launcher = "torchrun" if "RANK" in env or "WORLD_SIZE" in env else "none"
    slurm_rank = _integer(env, "SLURM_PROCID", 0)
    if launcher == "none" and slurm_rank is not None:
        tasks = _integer(env, "SLURM_STEP_NUM_TASKS", 1) or _integer(env, "SLURM_NTASKS", 1) or 1
        if tasks > 1:
            launcher = "slurm"
            env["RANK"] = str(slurm_rank)
            env["WORLD_SIZE"] = str(tasks)
            env.setdefault("LOCAL_RANK", str(_integer(env, "SLURM_LOCALID", 0) or 0))
            if "MASTER_ADDR" not in env:
                env["MASTER_ADDR"] = first_host(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
            env.setdefault("MASTER_PORT", str(slurm_master_port(env)))
    world = _integer(env, "WORLD_SIZE", 1) or 1
    rank = _integer(env, "RANK", 0)
    if world > 1 and rank is None:
        raise DihalValueError(
            f"WORLD_SIZE={world} but RANK is not set; launch with torchrun --nproc_per_node {world} "
            "(or the deepspeed launcher, or srun)"
        )
    rank = rank or 0
    if rank >= world and "WORLD_SIZE" in env:
        raise DihalValueError(f"RANK={rank} must be smaller than WORLD_SIZE={world}")
    local_rank = _integer(env, "LOCAL_RANK", 0)
    return LaunchInfo(rank, rank if local_rank is None else local_rank, world, launcher)


def set_local_rank(value: int, env: MutableMapping[str, str] | None = None) -> None:
    """``--local_rank=N`` as the ``deepspeed`` launcher passes it: sets ``LOCAL_RANK`` (an env value it
    contradicts is an error)."""
    env = os.environ if env is None else env
    if value < 0:
        raise DihalValueError(f"--local_rank must be >= 0, got {value}")
    given = env.get("LOCAL_RANK")
    if given is not None and given != str(value):
        raise DihalValueError(f"--local_rank={value} contradicts LOCAL_RANK={given} in the environment")
    env["LOCAL_RANK"] = str(value)
