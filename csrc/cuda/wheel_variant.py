"""cibuildwheel before-build: turn the project (the build container's copy) into one wheel variant.

DIHAL_WHEEL_VARIANT=cpu leaves it alone. cu12 / cu13 rename the distribution to dihal_fast_cu12 /
dihal_fast_cu13 (the import package stays dihal_fast), add the nvidia cuBLAS wheel of that CUDA
major as a dependency (opened at run time by dihal_fast._cuda) and make sure nvcc is there, so that
a CUDA variant can never be built without its CUDA module.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

RUNTIME_WHEELS = {"cu12": ["nvidia-cublas-cu12>=12.1"], "cu13": ["nvidia-cublas>=13.0"]}


def apply(pyproject: str, variant: str) -> str:
    """The pyproject.toml text for ``variant`` (cpu, cu12 or cu13)."""
    if variant == "cpu":
        return pyproject
    if variant not in RUNTIME_WHEELS:
        raise ValueError(f"DIHAL_WHEEL_VARIANT must be cpu, cu12 or cu13, got {variant!r}")
    if f'name = "dihal_fast_{variant}"' in pyproject:  # already applied (before-build runs per Python)
        return pyproject
    text, renamed = re.subn(r'(?m)^name = "dihal_fast"$', f'name = "dihal_fast_{variant}"', pyproject)
    text, extended = re.subn(
        r"(?ms)^dependencies = \[\n(.*?)^\]",
        lambda m: "dependencies = [\n" + m.group(1) + "".join(f'  "{w}",\n' for w in RUNTIME_WHEELS[variant]) + "]",
        text,
    )
    if renamed != 1 or extended != 1:
        raise ValueError("pyproject.toml no longer has the expected name / dependencies layout")
    return text


def main() -> int:
    variant = os.environ.get("DIHAL_WHEEL_VARIANT", "cpu")
    path = Path(__file__).resolve().parents[2] / "pyproject.toml"
    path.write_text(apply(path.read_text(), variant))
    if variant != "cpu" and not shutil.which("nvcc"):
        print(f"variant {variant}: nvcc is not on the PATH (did before-all install the toolkit?)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
