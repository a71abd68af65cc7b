"""DeepSpeed ZeRO (stages 0-3) engine: the same interface as :class:`~dihal_fast.train.engines.TorchEngine`.

Only the trainable parameters (the bridge, plus the retained layers with ``train_upper``) go to the
optimizer, and frozen submodules (the tensors a hybrid shares with its teacher) stay outside the engine
(:func:`keep_frozen_outside`): one copy per process, whatever the ZeRO stage. The optimizer is torch's
AdamW, so no DeepSpeed op is ever compiled (the optional shared-memory communication op is switched off too;
gloo carries CPU collectives). A DeepSpeed config is checked before anything starts: asking for a GPU-only
feature on a CPU machine, an optimizer or scheduler section (this trainer owns both), or batch settings that
contradict the loop settings are clear errors.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from dihal_fast.common import read_json
from dihal_fast.common.io import writing
from dihal_fast.common.launch import DEFAULT_MASTER_ADDR, launcher_env
from dihal_fast.errors import DihalValueError
from dihal_fast.train.engines import make_optimizer, trainable_parameters
from dihal_fast.train.settings import LoopSettings

logger = logging.getLogger(__name__)
_TAG = "engine"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def world_size_from_env() -> int:
    """The number of processes torchrun, the deepspeed launcher or ``srun`` started (1 when not launched)."""
    return launcher_env().world_size


def load_deepspeed_config(path: str | os.PathLike, settings: LoopSettings, cuda: bool | None = None) -> dict:
    """Read and check a DeepSpeed JSON config; returns it with the batch/clipping keys filled in."""
    return check_deepspeed_config(
        read_json(path, "DeepSpeed config"), settings, torch.cuda.is_available() if cuda is None else cuda, str(path)
    )


def check_deepspeed_config(ds: dict, settings: LoopSettings, cuda: bool, name: str = "DeepSpeed config") -> dict:
    """Validate ``ds`` against this trainer and machine; fill ``train_micro_batch_size_per_gpu`` etc."""
    if not isinstance(ds, dict):
        raise DihalValueError(f"{name} must be a JSON object, got {type(ds).__name__}")
    ds = copy.deepcopy(ds)
    for section in ("optimizer", "scheduler"):
        if section in ds:
            raise DihalValueError(
                f"{name} has an {section!r} section; remove it: dihal passes a torch AdamW and its own "
                "warm-up/cosine schedule (set --lr, --warmup-steps), so no DeepSpeed op needs compiling"
            )
    zero = ds.get("zero_optimization", {})
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise DihalValueError(f"{name}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    if not cuda:
        _reject_gpu_only(ds, zero, name)
    world = world_size_from_env()
    accum = settings.grad_accum_steps
    expected = {
        "train_micro_batch_size_per_gpu": settings.batch_size,
        "gradient_accumulation_steps": accum,
        "train_batch_size": settings.batch_size * accum * world,
        "gradient_clipping": settings.grad_clip,
    }
    for key, value in expected.items():
        given = ds.get(key, "auto")
        if given != "auto" and given != value:
            raise DihalValueError(
                f"{name}: {key} = {given!r} contradicts the training settings ({value!r}: --batch-size "
                f"{settings.batch_size} per process x --grad-accum-steps {accum} x {world} processes, "
                f"--grad-clip {settings.grad_clip}); set those options instead, or remove the key or set it "
                'to "auto"'
            )
        ds[key] = value
    ds.setdefault("steps_per_print", 10**9)
    return ds


def _reject_gpu_only(ds: dict, zero: dict, name: str) -> None:
    """Raise for features that need a GPU (or a compiled op) when the machine has none."""
    if ds.get("fp16", {}).get("enabled", False) in (True, "auto"):
        raise DihalValueError(
            f"{name} enables fp16, whose dynamic loss scaling needs a CUDA GPU; this machine has none "
            '(use "bf16": {"enabled": true} or full precision on CPU)'
        )
    if ds.get("amp", {}).get("enabled", False):
        raise DihalValueError(f"{name} enables apex AMP, which needs a CUDA GPU; this machine has none")
    for key in ("offload_optimizer", "offload_param"):
        device = zero.get(key, {}).get("device", "none")
        if device not in (None, "none"):
            raise DihalValueError(
                f"{name}: zero_optimization.{key}.device = {device!r} offloads GPU memory "
                f"({'to NVMe through the compiled async_io op' if device == 'nvme' else 'to the host'}); "
                "this machine has no GPU, so remove the offload section"
            )


@contextlib.contextmanager
def distributed_session(cuda: bool) -> Iterator[tuple[int, int]]:
    """Process group for DeepSpeed (nccl on GPUs, gloo on CPU), yielding ``(rank, world_size)``.

    Outside a launcher the ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` defaults of
    a single process are set (and removed again at exit). Always ends with a barrier and
    ``destroy_process_group``, also when training fails.
    """
    import deepspeed
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # never JIT-compile a DeepSpeed op
    launcher_env()  # srun without torchrun: RANK/WORLD_SIZE/... from SLURM's variables
    defaults = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": DEFAULT_MASTER_ADDR,
        "MASTER_PORT": None,
    }
    added = [key for key in defaults if key not in os.environ]
    for key in added:
        os.environ[key] = defaults[key] or str(_free_port())
    try:
        if cuda:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", verbose=False)
        try:
            yield dist.get_rank(), dist.get_world_size()
            dist.barrier()
        finally:
            dist.destroy_process_group()
            _forget_deepspeed_groups()
    finally:
        for key in added:
            os.environ.pop(key, None)


def _forget_deepspeed_groups() -> None:
    """Drop the process groups DeepSpeed caches in ``deepspeed.utils.groups`` (e.g. its clone of the world
    group): after ``destroy_process_group`` they are stale, and a second session in the same process (two
    trainings from one Python program) would fail with "Group ... is not registered"."""
    from deepspeed.utils import groups

    for name, value in list(vars(groups).items()):
        if (
            name.startswith("_")
            and name[1:].isupper()
            and (value is None or isinstance(value, dict) or isinstance(value, dist.ProcessGroup))
        ):
            setattr(groups, name, {} if isinstance(value, dict) else None)


def keep_frozen_outside(module: nn.Module) -> list[str]:
    """Take each largest submodule of ``module`` whose parameters are all frozen out of its module tree, kept as a
    plain attribute (its forward runs as before, autograd still reaches the trainable parts through it); returns
    their dotted names.

    DeepSpeed then does not own the frozen tensors a hybrid shares with its teacher: ZeRO-3 would partition them
    (each rank a slice copy beside the teacher's whole tensor, the whole gathered again for every forward), a
    ``bf16`` section would cast them, and every checkpoint would hold them."""
    moved: list[str] = []

    def visit(parent: nn.Module, prefix: str) -> None:
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            parameters = list(child.parameters())
            if parameters and not any(p.requires_grad for p in parameters):
                del parent._modules[name]
                object.__setattr__(parent, name, child)
                moved.append(prefix + name)
            else:
                visit(child, f"{prefix}{name}.")

    visit(module, "")
    return moved


class DeepSpeedEngine:
    """ZeRO training inside :func:`distributed_session`."""

    kind = "deepspeed"

    def __init__(self, objective: nn.Module, settings: LoopSettings, ds_config: dict):
        import deepspeed

        self.settings, self.stage = settings, ds_config.get("zero_optimization", {}).get("stage", 0)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        cuda = torch.cuda.is_available()
        self.device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
        named = trainable_parameters(objective)
        optimizer, scheduler = make_optimizer(named, settings)
        self.outside = keep_frozen_outside(objective)
        self.engine, _, _, self.scheduler = deepspeed.initialize(
            model=objective,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            model_parameters=[p for _, p in named],
            config=ds_config,
        )
        self.module = self.engine.module
        self.named = trainable_parameters(self.module)

    def __call__(self, **inputs):
        return self.engine(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        """DeepSpeed's backward (it divides by ``gradient_accumulation_steps``); between accumulation boundaries
        also DeepSpeed's ``step()``, which there only counts the micro-batch, so that :meth:`step` is called once
        per optimizer step as with the plain-torch engine."""
        self.engine.backward(loss)
        if not self.engine.is_gradient_accumulation_boundary():
            self.engine.step()

    def step(self) -> float:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[list[tuple[str, nn.Parameter]]]:
        """The trainable parameters with full values on every rank (a collective under ZeRO-3)."""
        if self.stage < 3:
            yield self.named
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters([p for _, p in self.named], modifier_rank=None):
            yield self.named

    def save(self, directory: Path) -> None:
        """Collective: every rank writes its ZeRO partitions."""
        with writing(directory):
            self.engine.save_checkpoint(str(directory), tag=_TAG)

    def load(self, directory: Path) -> None:
        if not (directory / _TAG).is_dir():
            raise DihalValueError(
                f"checkpoint {directory} holds no DeepSpeed state ({directory / _TAG} missing); "
                "was it written by a plain-torch run?"
            )
        try:
            # Not strict: a checkpoint of an earlier version also holds the frozen tensors kept outside the engine;
            # the trainable ones were loaded and checked from the checkpoint's own weights file already.
            path, _ = self.engine.load_checkpoint(
                str(directory),
                tag=_TAG,
                load_module_strict=False,
                load_optimizer_states=True,
                load_lr_scheduler_states=True,
            )
        except Exception as exc:  # DeepSpeed raises many types for damaged or mismatched files
            raise DihalValueError(
                f"DeepSpeed checkpoint {directory} is corrupt or does not fit this run: {type(exc).__name__}: {exc}"
            ) from None
        if path is None:
            raise DihalValueError(f"DeepSpeed could not load a checkpoint from {directory}")

    def barrier(self) -> None:
        dist.barrier()

    def agree(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag true on any process (one small all-reduce; none in a single process)."""
        if self.world_size == 1:
            return flags
        votes = torch.tensor([int(flag) for flag in flags], dtype=torch.int32, device=self.device)
        dist.all_reduce(votes, op=dist.ReduceOp.MAX)
        return tuple(bool(vote) for vote in votes.tolist())
