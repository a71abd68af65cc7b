"""Loading of the compiled modules.

``import dihal_fast`` never fails because a compiled module or a GPU library is missing: the
modules are loaded on first use, and a missing one raises :class:`BackendUnavailable` with what was
tried and what to install.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os
from types import ModuleType

from dihal_fast.errors import DihalError


class BackendUnavailable(DihalError, RuntimeError):
    """A backend was asked for that is not compiled into this build or cannot run here."""


@functools.cache
def _preload_openblas() -> None:
    # The extension links libscipy_openblas.so; loading it first by full path makes the import
    # independent of the rpath (editable installs, relocated environments).
    import scipy_openblas32

    path = os.path.join(scipy_openblas32.get_lib_dir(), "libscipy_openblas.so")
    if os.path.exists(path):
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


LIBGOMP = "libgomp.so.1"
# Where a missing shared library of the CPU core comes from (named in the error instead of generic advice).
LIBRARY_PROVIDERS = {
    LIBGOMP: (
        "GCC's OpenMP runtime: install torch (pip install torch; its wheel carries torch/lib/libgomp.so.1, "
        "which the core then shares) or the system package (apt-get install libgomp1 / dnf install libgomp)"
    ),
    "libscipy_openblas.so": "OpenBLAS of the scipy-openblas32 wheel: pip install scipy-openblas32",
}


def torch_libgomp() -> str | None:
    """torch's bundled libgomp.so.1 (torch/lib), found without importing torch; None without one."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, "lib", LIBGOMP)
        if os.path.isfile(path):
            return path
    return None


@functools.cache
def _preload_libgomp() -> str:
    """Load torch's libgomp.so.1 before the core, so that the core's DT_NEEDED libgomp.so.1 binds to it: one
    OpenMP runtime for torch and the core, on hosts without a system libgomp too. Returns the path loaded
    ('' without torch's: the loader then looks for a system libgomp.so.1)."""
    path = torch_libgomp()
    if path is None:
        return ""
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise ImportError(f"torch's {LIBGOMP} ({path}) could not be loaded: {exc}") from exc
    return path


def loaded_libgomp() -> list[str]:
    """The paths of the libgomp copies mapped into this process (one when torch and the core share it)."""
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split()[-1] for line in maps if "/libgomp" in line})
    except OSError:  # not Linux
        return []


def missing_library_reason(exc: ImportError) -> str:
    """The missing shared library named by an ImportError of the core and what provides it ('' if none)."""
    text = str(exc)
    for library, provider in LIBRARY_PROVIDERS.items():
        if library in text and "cannot open shared object file" in text:
            return f"{library} was not found: it is {provider}"
    return ""


# The distributions that install the dihal_fast package: the CPU wheel and the CUDA variants. They
# overwrite each other's files, so at most one may be installed.
VARIANTS = ("dihal_fast", "dihal_fast_cu12", "dihal_fast_cu13")


@functools.cache
def installed_variants() -> tuple[str, ...]:
    """The installed distributions among :data:`VARIANTS` (normalised names)."""
    from importlib import metadata

    names = {
        dist.metadata["Name"].replace("-", "_").lower() for dist in metadata.distributions() if dist.metadata["Name"]
    }
    return tuple(v for v in VARIANTS if v in names)


def variant_conflict() -> str:
    """A reason when more than one variant is installed (their compiled modules may be mixed), else ''."""
    found = installed_variants()
    if len(found) < 2:
        return ""
    return (
        f"several dihal_fast variants are installed ({', '.join(found)}) and overwrite each other's files: "
        f"pip uninstall -y {' '.join(found)}, then install exactly one"
    )


@functools.cache
def _load(name: str) -> tuple[ModuleType | None, str]:
    conflict = variant_conflict()
    if conflict:
        return None, conflict
    try:
        if name == "_core":
            _preload_openblas()
            _preload_libgomp()
        return importlib.import_module(f"dihal_fast.{name}"), ""
    except ImportError as exc:  # not compiled, or a shared library missing
        return None, missing_library_reason(exc) or f"{type(exc).__name__}: {exc}"


def core() -> ModuleType:
    """The compiled CPU module, or :class:`BackendUnavailable` saying why it cannot be loaded."""
    module, reason = _load("_core")
    if module is None:
        if reason.startswith("ModuleNotFoundError"):  # a source install that compiled no core
            advice = (
                "Reinstall the package from source with a C++17 compiler: pip install --force-reinstall --no-deps ."
            )
        else:
            advice = "Install what is missing, or use backend='reference' (the NumPy code)."
        raise BackendUnavailable(f"the compiled CPU core (dihal_fast._core) could not be loaded ({reason}). {advice}")
    return module


def cuda_module() -> ModuleType:
    """The compiled CUDA module, or :class:`BackendUnavailable` saying why not."""
    module, reason = _load("_cuda")
    if module is None:
        raise BackendUnavailable(
            "the CUDA backend is not compiled into this build "
            f"({reason}). Build on a machine with nvcc (DIHAL_CUDA=ON pip install .)."
        )
    count, why = module.device_count()
    if count == 0:
        raise BackendUnavailable(f"the CUDA backend is compiled but no CUDA device can be used here ({why})")
    return module


def build_info() -> dict:
    """What was compiled into this build and which backends can run on this machine."""
    from dihal_fast._version import __version__

    info: dict = {
        "version": __version__,
        "distribution": ", ".join(installed_variants()) or "(not installed)",
        "backends": {},
    }
    core_module, core_reason = _load("_core")
    info["backends"]["reference"] = {"compiled": True, "available": True, "reason": ""}
    info["backends"]["cpu"] = {
        "compiled": core_module is not None,
        "available": core_module is not None,
        "reason": core_reason,
    }
    if core_module is not None:
        info["cpu"] = dict(core_module.build_info())
        info["cpu"]["libgomp"] = loaded_libgomp()
    cuda, cuda_reason = _load("_cuda")
    cuda_entry = {"compiled": cuda is not None, "available": False, "reason": cuda_reason}
    if cuda is not None:
        count, why = cuda.device_count()
        cuda_entry.update(available=count > 0, devices=count, reason=why)
        cuda_entry.update(dict(cuda.build_info()))
    info["backends"]["cuda"] = cuda_entry
    cuvs_compiled = bool(cuda is not None and cuda_entry.get("cuvs_compiled", False))
    info["backends"]["cuvs"] = {
        "compiled": cuvs_compiled,
        "available": cuvs_compiled and cuda_entry["available"],
        "reason": cuda_entry["reason"] if cuvs_compiled else "built without cuVS (libcuvs not found at build time)",
    }
    if cuvs_compiled:  # the library opened at run time must be this release (libcuvs-cuNN==YY.MM.*)
        info["backends"]["cuvs"]["cuvs_version"] = cuda_entry["cuvs_version"]
        # where cuVS's temporaries come from: "torch (...)" or "rmm default (...)" (csrc/cuda/rmm_route.hpp)
        info["backends"]["cuvs"]["allocator"] = cuda_entry.get("cuvs_allocator", "")
    return info
