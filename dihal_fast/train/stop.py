"""Stopping a training run without losing work: SIGTERM and Ctrl-C inside :func:`~dihal_fast.train.trainer.fit`
ask the loop to stop after the optimizer step in progress; the loop then writes that step's checkpoint and raises
:class:`KeyboardInterrupt` with a line naming the step a rerun continues from.

The state is only checkpointed between steps, where it is exact (weights, optimizer, EMA, random streams of
the same step), so a stopped run resumes bit for bit. A second Ctrl-C stops at once, without that checkpoint;
a repeated SIGTERM (a supervisor repeating its request) only repeats the request.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """Whether a signal asked the loop to stop; set by the handlers of :func:`stop_on_signals`."""

    def __init__(self) -> None:
        self.requested = False

    def handle(self, signum: int, frame: object) -> None:
        """Signal handler: the first signal asks to stop after the step in progress, a second SIGINT stops now."""
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not self.requested:
            logger.warning(
                "%s: stopping after the step in progress, with its checkpoint (Ctrl-C again stops at once, without it)",
                signal.Signals(signum).name,
            )
        self.requested = True


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """SIGINT and SIGTERM set the yielded :class:`StopRequest` while the block runs (main thread only; a signal
    the process ignores, as SIGINT in a background job, stays ignored); the previous handlers come back after."""
    stop = StopRequest()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, stop.handle)
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class StoppedRun(Protocol):
    """What :func:`interrupted` reads of a :class:`~dihal_fast.train.trainer.TrainingRun`."""

    run_dir: Path
    step: int
    checkpoint_step: int


def interrupted(runs: Sequence[StoppedRun]) -> KeyboardInterrupt:
    """The :class:`KeyboardInterrupt` of runs stopped by a signal (logged as a warning too): for each, the step
    its rerun continues from (its newest checkpoint) or that it holds none and starts from step 0."""
    parts = [
        f"{run.run_dir} continues from step {run.checkpoint_step} (checkpoints/step_{run.checkpoint_step:08d})"
        if run.checkpoint_step
        else f"{run.run_dir} holds no checkpoint and starts from step 0"
        for run in runs
    ]
    stopped = ", ".join(sorted({str(run.step) for run in runs}))
    message = f"interrupted after step {stopped}; a rerun of {'; '.join(parts)}"
    logger.warning("%s", message)
    return KeyboardInterrupt(message)
