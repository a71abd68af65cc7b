"""Progress reporting for every long loop: a tqdm bar on a terminal, plain lines in a log file.

A redrawn bar writes a carriage return per update, so a redirected log fills with bar fragments on one
physical line that ``grep`` and ``tail`` cannot read. :func:`progress_bar` takes tqdm's arguments and
picks by ``DIHAL_PROGRESS``:

- ``auto`` (default): a bar when stderr is a terminal (or a Jupyter kernel), plain lines otherwise;
- ``1`` / ``bar``: always a bar; ``plain``: always plain lines; ``0`` / ``off``: nothing.

Plain mode prints whole lines, never a carriage return: one when the loop passes each tenth of its
total (at most one per :data:`PLAIN_MIN_GAP_S`), one at least every :data:`PLAIN_EVERY_S` while it
advances, and a last one when it ends. :func:`quiet_library_bars` keeps Hugging Face's bars out of
such logs too.
"""

from __future__ import annotations

import io
import os
import sys
import time
import warnings
from collections.abc import Iterable
from typing import Any

from tqdm import tqdm
from tqdm.auto import tqdm as bar_tqdm

PLAIN_EVERY_S = 30.0  # longest silence of a plain-mode loop that advances
PLAIN_MIN_GAP_S = 5.0  # shortest gap between two "another tenth done" lines
MODES = {"auto": "auto", "": "auto", "1": "bar", "bar": "bar", "plain": "plain", "0": "off", "off": "off"}


def progress_mode() -> str:
    """``"bar"``, ``"plain"`` or ``"off"``, from ``DIHAL_PROGRESS`` and whether stderr is a terminal."""
    value = os.environ.get("DIHAL_PROGRESS", "auto").strip().lower()
    mode = MODES.get(value)
    if mode is None:
        warnings.warn(f"DIHAL_PROGRESS={value!r} is not one of {sorted(set(MODES) - {''})}; using auto", stacklevel=3)
        mode = "auto"
    if mode == "auto":
        interactive = sys.stderr.isatty() or "ipykernel" in sys.modules
        mode = "bar" if interactive else "plain"
    return mode


def progress_bar(iterable: Iterable | None = None, **options: Any) -> tqdm:
    """A progress bar over ``iterable`` (or updated by hand), with tqdm's options, in the mode of
    :func:`progress_mode`; ``disable=True`` from the caller still hides it."""
    mode = progress_mode()
    if mode == "off":
        options["disable"] = True
    return (PlainProgress if mode == "plain" else bar_tqdm)(iterable, **options)


def quiet_library_bars() -> None:
    """Outside bar mode, turn off the Hugging Face libraries' own bars (loading weights, writing shards),
    which redraw with carriage returns. Call it before ``transformers`` is imported (it reads
    ``HF_HUB_DISABLE_PROGRESS_BARS`` then); a value the user set is kept."""
    if progress_mode() != "bar":
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


class PlainProgress(tqdm):
    """A tqdm that reports in whole lines on stderr (see the module docstring for when)."""

    def __init__(self, iterable: Iterable | None = None, **options: Any) -> None:
        self._stream = options.pop("file", None)
        self._started = False
        # tqdm's own drawing (carriage returns, cursor moves) goes nowhere; display() writes the lines
        super().__init__(iterable, file=io.StringIO(), **options)
        self._last_line_s, self._last_tenth, self._printed_n = time.monotonic(), self._tenth(), self.n
        self._started = True

    def _tenth(self) -> int | None:
        return int(10 * self.n / self.total) if self.total else None

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if not self._started:  # tqdm's constructor draws once: nothing to report yet
            return True
        now, tenth = time.monotonic(), self._tenth()
        final = self.disable  # close() marks the bar disabled before its last display
        due = now - self._last_line_s >= PLAIN_EVERY_S or (
            tenth is not None
            and (self._last_tenth is None or tenth > self._last_tenth)
            and now - self._last_line_s >= PLAIN_MIN_GAP_S
        )
        if (final or due) and self.n != self._printed_n:
            stream = self._stream or sys.stderr
            stream.write(self._line() + "\n")
            stream.flush()
            self._last_line_s, self._last_tenth, self._printed_n = now, tenth, self.n
        return True

    def _line(self) -> str:
        desc = self.desc.replace("{", "{{").replace("}", "}}") + ": " if self.desc else ""
        if self.total:
            shape = desc + "{percentage:.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
        else:
            shape = desc + "{n_fmt} [{elapsed}, {rate_fmt}{postfix}]"
        return self.format_meter(**{**self.format_dict, "bar_format": shape, "ncols": None, "prefix": ""})
