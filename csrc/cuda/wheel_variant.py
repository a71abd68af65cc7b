"""cibuildwheel before-build (and packaging/build_wheels.sh): turn the project (the build container's
copy) into one wheel variant.

cpu builds the CPU module only (DIHAL_CUDA=OFF even where nvcc exists, so a CPU wheel never carries
a CUDA module under the CPU name). cu12 / cu13 rename the distribution to dihal_fast_cu12 /
dihal_fast_cu13 (the import package stays dihal_fast; dihal_fast._native refuses to load compiled
modules when more than one variant is installed, the conflict pip cannot express), require the CUDA
module (DIHAL_CUDA=ON), pin the nvidia cuBLAS wheel to the CUDA runtime's major (opened at run time
by dihal_fast._cuda, never a library of the other major) and set the architectures the toolkit can
build: SASS for sm_80 and sm_90, plus sm_100 and sm_120 where nvcc knows them, and PTX of the newest.

GPU variants are built with cuVS (DIHAL_CUVS=ON): the build
requirements gain libcuvs-cu12/-cu13 of release $CUVS_RELEASE (default 26.10), whose headers and librmm
(cuVS allocating through torch, csrc/cuda/rmm_torch.cpp) CMake finds in the build environment; the
DLPack header comes from csrc/third_party/dlpack. CUVS_RELEASE=none builds without cuVS.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

RUNTIME_WHEELS = {"cu12": ["nvidia-cublas-cu12>=12.1,<13"], "cu13": ["nvidia-cublas>=13.0,<14"]}
CMAKE_TABLE = "[tool.scikit-build.cmake.define]"
CUVS_RELEASE = "26.10"  # the cuVS (and RMM) release compiled in; libcuvs_c.so must be this one at run time


def architectures(supported: set[int]) -> str:
    """CMake CUDA_ARCHITECTURES: SASS of sm_80 / sm_90 and of sm_100 / sm_120 where supported, PTX of the newest."""
    archs = [a for a in (80, 90, 100, 120) if a in supported or a <= 90]
    return ";".join(f"{a}-real" for a in archs[:-1]) + f";{archs[-1]}"


def nvcc_architectures() -> set[int]:
    """The sm_XY numbers of ``nvcc --list-gpu-arch`` (empty without nvcc)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return set()
    out = subprocess.run([nvcc, "--list-gpu-arch"], check=True, capture_output=True, text=True).stdout
    return {int(m) for m in re.findall(r"compute_(\d+)", out)}


def _set_define(text: str, key: str, value: str) -> str:
    line = f'{key} = "{value}"'  # fixed for the variant: no environment variable can change it
    pattern = rf"(?m)^{key} = .*$"
    if re.search(pattern, text):
        return re.sub(pattern, lambda _: line, text)
    if CMAKE_TABLE not in text:
        raise ValueError(f"pyproject.toml has no {CMAKE_TABLE} table")
    return text.replace(CMAKE_TABLE + "\n", CMAKE_TABLE + "\n" + line + "\n", 1)


def cuvs_build_requirement(variant: str, release: str) -> str:
    """The build requirement that brings cuVS's headers and librmm ("" for no cuVS: cpu or release none)."""
    if variant == "cpu" or release == "none":
        return ""
    if not re.fullmatch(r"\d+\.\d+", release):
        raise ValueError(f"CUVS_RELEASE must be YY.MM (like {CUVS_RELEASE}) or none, got {release!r}")
    return f"libcuvs-{variant}=={release}.*"


def _set_cuvs_requirement(text: str, requirement: str) -> str:
    """[build-system] requires without any libcuvs entry, plus ``requirement`` when given."""
    match = re.search(r"(?m)^requires = \[(.*)\]$", text)
    if match is None:
        raise ValueError("pyproject.toml has no one-line [build-system] requires")
    entries = [e.strip() for e in match.group(1).split(",") if e.strip() and "libcuvs-" not in e]
    entries += [f'"{requirement}"'] if requirement else []
    return text[: match.start()] + f"requires = [{', '.join(entries)}]" + text[match.end() :]


def apply(
    pyproject: str,
    variant: str,
    supported: set[int] | None = None,
    cuvs_release: str = CUVS_RELEASE,
) -> str:
    """The pyproject.toml text for ``variant`` (cpu, cu12 or cu13); ``supported``: nvcc's
    architectures. Re-applicable (cibuildwheel runs it once per Python, on one copy of the project)."""
    if variant == "cpu":
        return _set_define(pyproject, "DIHAL_CUDA", "OFF")
    if variant not in RUNTIME_WHEELS:
        raise ValueError(f"DIHAL_WHEEL_VARIANT must be cpu, cu12 or cu13, got {variant!r}")
    text = _set_define(pyproject, "DIHAL_CUDA", "ON")
    text = _set_define(text, "DIHAL_CUDA_ARCHITECTURES", architectures(supported or set()))
    requirement = cuvs_build_requirement(variant, cuvs_release)
    text = _set_define(text, "DIHAL_CUVS", "ON" if requirement else "OFF")
    text = _set_cuvs_requirement(text, requirement)
    if f'name = "dihal_fast_{variant}"' in text:  # already applied (before-build runs per Python)
        return text
    text, renamed = re.subn(r'(?m)^name = "dihal_fast"$', f'name = "dihal_fast_{variant}"', text)
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
    if variant != "cpu" and not shutil.which("nvcc"):
        print(f"variant {variant}: nvcc is not on the PATH (did before-all install the toolkit?)", file=sys.stderr)
        return 1
    release = os.environ.get("CUVS_RELEASE", CUVS_RELEASE)
    text = apply(path.read_text(), variant, nvcc_architectures(), release)
    path.write_text(text)
    if variant != "cpu":
        print(f"variant {variant}, Python {sys.version.split()[0]}: cuVS {'ON' if 'libcuvs-' in text else 'OFF'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
