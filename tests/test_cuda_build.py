"""The CUDA build: what was compiled, availability reporting, the errors of unusable GPU setups and the
wheel variants (all run on any machine). The CUDA kernels themselves are tested against
``dihal_fast.reference`` in the backend x dtype grid of ``test_geometry_kernels.py``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import dihal_fast as df
from dihal_fast import _native
from dihal_fast.geometry import backend_cuda
from dihal_fast.geometry.backends import get_backend

torch = pytest.importorskip("torch")

CUDA_INFO = df.build_info()["backends"]["cuda"]
ROOT = Path(__file__).resolve().parents[1]


def _wheel_variant():
    """csrc/cuda/wheel_variant.py (cibuildwheel's before-build) as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("wheel_variant", ROOT / "csrc" / "cuda" / "wheel_variant.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cuda_module():
    module, reason = _native._load("_cuda")
    if module is None:
        pytest.skip(f"the CUDA module is not compiled into this build ({reason})")
    return module


# ---------------------------------------------------------------- build and availability (any machine)
def test_cuda_module_compiled_when_nvcc_present():
    nvcc = shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")
    if not nvcc or os.environ.get("DIHAL_CUDA") == "OFF":
        pytest.skip("no nvcc on this machine (or DIHAL_CUDA=OFF): the CUDA module is not expected")
    assert CUDA_INFO["compiled"], CUDA_INFO["reason"]
    assert "80" in CUDA_INFO["cuda_architectures"] and "90" in CUDA_INFO["cuda_architectures"]
    assert isinstance(CUDA_INFO["cuvs_compiled"], bool)


def test_unavailable_backend_reports_a_reason():
    if CUDA_INFO["available"]:
        pytest.skip("a CUDA device is usable here")
    assert CUDA_INFO["reason"], "an unavailable backend must say why"
    if CUDA_INFO["compiled"]:
        assert CUDA_INFO["devices"] == 0


@pytest.mark.parametrize("backend", ["cuda", "cuvs"])
def test_asking_for_an_unavailable_gpu_backend_raises(backend):
    if CUDA_INFO["available"]:
        pytest.skip("a CUDA device is usable here")
    X = np.random.default_rng(0).standard_normal((20, 4))
    with pytest.raises(df.BackendUnavailable, match="CUDA|cuVS"):
        df.knn(X, 3, backend=backend)
    with pytest.raises(df.BackendUnavailable, match="CUDA|cuVS"):
        get_backend(backend)


@pytest.mark.parametrize("capability", [(9, 0), (7, 5)])
def test_unusable_gpu_setups_say_what_is_missing(monkeypatch, capability):
    # A GPU that torch sees, but no cuBLAS anywhere (9.0) or an architecture we do not build for (7.5).
    module = _cuda_module()
    if module.build_info()["cublas_loaded"]:
        pytest.skip("cuBLAS is already loaded in this process")
    monkeypatch.setattr(_native, "cuda_module", lambda: module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: capability)
    monkeypatch.setattr(backend_cuda, "_library_candidates", lambda *a: ["/nonexistent/libcublas.so.13"])
    with pytest.raises(df.BackendUnavailable) as err:
        backend_cuda.create("cuda")
    assert "nvidia-cublas" in str(err.value) and "/nonexistent/libcublas.so.13" in str(err.value)
    # The architecture is checked on the device of the rows (not the current device), when they arrive.
    seen = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: seen.append(device) or capability)
    if capability >= (8, 0):
        backend_cuda.require_capability(module, "cuda", torch.device("cuda", 1))
    else:
        with pytest.raises(df.BackendUnavailable, match="sm_75"):
            backend_cuda.require_capability(module, "cuda", torch.device("cuda", 1))
    assert seen == [torch.device("cuda", 1)]


class _RowsOnDevice:
    """What CudaBackend._matrix reads of a CUDA tensor (device, dtype, detach, contiguous), on a device index that
    needs no GPU here."""

    def __init__(self, index: int) -> None:
        self.device = torch.device("cuda", index)
        self.dtype = torch.float32

    def detach(self) -> _RowsOnDevice:
        return self

    def contiguous(self) -> _RowsOnDevice:
        return self


def test_matrix_checks_the_capability_of_the_rows_device_not_the_current_one(monkeypatch):
    # Two GPUs: device 0 is sm_90, device 1 sm_75. Rows on the device that is not current decide.
    capabilities = {0: (9, 0), 1: (7, 5)}
    current = [0]
    asked = []

    def capability(device=None):
        # torch's rule: None, or a device without an index, means the current device
        index = device if isinstance(device, int) else None if device is None else torch.device(device).index
        index = current[0] if index is None else index
        asked.append(index)
        return capabilities[index]

    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    module = SimpleNamespace(build_info=lambda: {"cuda_architectures": "80-real,90"})
    backend = backend_cuda.CudaBackend(module, use_cuvs=False)
    with pytest.raises(df.BackendUnavailable, match="cuda:1 is sm_75"):
        backend._matrix(_RowsOnDevice(1))  # current device 0 is sm_90: passing would mean it was asked instead
    with pytest.raises(df.BackendUnavailable, match="cuda:1 is sm_75"):
        backend._matrix(_RowsOnDevice(1))  # a refused device is not remembered as checked
    current[0] = 1
    rows = _RowsOnDevice(0)
    assert backend._matrix(rows) is rows  # current device 1 is sm_75; the rows' device 0 is sm_90
    assert backend._matrix(rows) is rows
    assert asked == [1, 1, 0]  # each device once it passed, the rows' device every time


@pytest.mark.parametrize("dtype", [0, 1, 2, 3], ids=["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("D", [128, 8192])
def test_knn_workspace_holds_no_centred_copy(dtype, D):
    # Tiled centring (csrc/cuda/knn.cu): query and reference tiles are centred as they are read, so the workspace
    # grows by a few per-row scalars (norms, row maxima), not by a centred n x D copy (64 GB at n = 2e6, D = 8192).
    module = _cuda_module()
    small, large = 20_000, 2_000_000
    ws_small, ws_large = (module.knn_workspace(n, D, 16, dtype, False) for n in (small, large))
    assert ws_large - ws_small <= 32 * (large - small)  # a centred copy would add at least 4 D bytes per row


@pytest.mark.parametrize("dtype", [0, 2, 3], ids=["float16", "float32", "float64"])
@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("D", [128, 8192])
def test_covariance_workspace_is_one_block_of_rows(dtype, exact, D):
    # Rows are centred one block at a time (csrc/cuda/covariance.cu, block_rows): past one block the workspace
    # (at most 16,384 rows) does not grow with n.
    module = _cuda_module()
    small, large = 20_000, 10_000_000
    ws_small, ws_large = (module.covariance_workspace(n, D, dtype, exact) for n in (small, large))
    assert ws_large == ws_small


def test_cuvs_backend_without_cuvs_says_what_to_install():
    """On a build without cuVS, backend="cuvs" says so (and how to get it) before anything about the GPUs."""
    if _native.build_info()["backends"]["cuvs"]["compiled"]:
        pytest.skip("this build has cuVS")
    X = np.random.default_rng(0).standard_normal((20, 4))
    for call in (lambda: df.knn(X, 3, backend="cuvs"), lambda: get_backend("cuvs")):
        with pytest.raises(df.BackendUnavailable, match=r"built without cuVS.*dihal_fast_cu12.*libcuvs-cu13") as err:
            call()
        assert "device" not in str(err.value)


def test_build_refusal_names_what_the_build_lacks():
    """A build without CUDA refuses cuda and cuvs naming the CUDA wheels; one with CUDA but no cuVS refuses only
    cuvs; one with both refuses nothing (the machine's GPUs are checked after)."""
    no_cuda = {"cuda": {"compiled": False, "reason": "no _cuda module"}, "cuvs": {"compiled": False}}
    for name in ("cuda", "cuvs"):
        refusal = backend_cuda.build_refusal(name, no_cuda)
        assert refusal.startswith(f"backend={name!r}: this dihal_fast was built without CUDA (no _cuda module)")
        assert "pip install dihal_fast_cu12 or dihal_fast_cu13" in refusal and "DIHAL_CUDA=ON" in refusal
    no_cuvs = {"cuda": {"compiled": True}, "cuvs": {"compiled": False}}
    assert backend_cuda.build_refusal("cuda", no_cuvs) == ""
    assert "built without cuVS" in backend_cuda.build_refusal("cuvs", no_cuvs)
    assert backend_cuda.build_refusal("cuvs", {"cuda": {"compiled": True}, "cuvs": {"compiled": True}}) == ""


def test_cuvs_library_must_be_the_release_of_the_headers():
    # The rule load_cuvs applies to the libcuvs_c.so it opens (csrc/cuda/cuvs_version.hpp): cuVS's C API changes
    # between YY.MM releases, patch releases keep it.
    module = _cuda_module()
    assert module.cuvs_version_problem((26, 10, 0), (26, 10, 3), 13) == ""
    problem = module.cuvs_version_problem((26, 10, 0), (25, 6, 1), 12)
    assert "cuVS 25.06.1" in problem and "cuVS 26.10.0" in problem and 'pip install "libcuvs-cu12==26.10.*"' in problem
    assert module.cuvs_version_problem((26, 10, 0), (26, 8, 0), 13)
    assert module.cuvs_version_problem((26, 10, 0), (27, 10, 0), 13)
    info = module.build_info()
    assert info["cuvs_compiled"] == bool(info["cuvs_version"])


def test_cuvs_library_of_the_compiled_release_loads():
    # No GPU needed: load_cuvs opens libcuvs_c.so, binds the C API and checks cuvsVersionGet against the headers.
    import importlib.util

    module = _cuda_module()
    if not module.build_info()["cuvs_compiled"]:
        pytest.skip("this build has no cuVS (packaging/build_wheels.sh cu12|cu13 compiles it in)")
    if importlib.util.find_spec("libcuvs") is None:
        pytest.skip(f'no libcuvs wheel installed (pip install "{backend_cuda.cuvs_requirement(module.build_info())}")')
    backend_cuda._load_cuvs(module)
    assert module.load_cuvs(["libcuvs_c.so"])  # loaded once, then the same library is returned


@pytest.mark.parametrize(
    ("runtime", "headers", "wheel"),
    [
        (12040, "26.10.0", "libcuvs-cu12==26.10.*"),
        (13000, "26.6.2", "libcuvs-cu13==26.6.*"),
        (13000, "", "libcuvs-cu13"),
    ],
)
def test_cuvs_requirement_names_the_cuda_major_and_release(runtime, headers, wheel):
    assert backend_cuda.cuvs_requirement({"cuda_runtime_version": runtime, "cuvs_version": headers}) == wheel


def test_library_candidates_try_sonames_first():
    candidates = backend_cuda._library_candidates("libcublas", (13, 12), ("cu13/lib",))
    assert candidates[:2] == ["libcublas.so.13", "libcublas.so.12"]


@pytest.mark.parametrize("variant", ["cpu", "cu12", "cu13"])
def test_wheel_variants_rewrite_pyproject(variant):
    import tomllib

    wheel_variant = _wheel_variant()
    original = (ROOT / "pyproject.toml").read_text()
    text = wheel_variant.apply(original, variant)
    assert wheel_variant.apply(text, variant) == text  # idempotent: cibuildwheel runs it once per Python
    project = tomllib.loads(text)["project"]
    base = tomllib.loads(original)["project"]
    if variant == "cpu":
        assert project == base
    else:
        assert project["name"] == f"dihal_fast_{variant}"
        assert project["dependencies"][: len(base["dependencies"])] == base["dependencies"]
        assert any(dep.startswith("nvidia-cublas") for dep in project["dependencies"])


def test_two_installed_variants_refuse_to_load(monkeypatch):
    """dihal_fast and dihal_fast_cu13 overwrite each other's files: the compiled modules are not loaded, with the
    fix."""
    monkeypatch.setattr(_native, "installed_variants", lambda: ("dihal_fast", "dihal_fast_cu13"))
    module, reason = _native._load.__wrapped__("_core")
    assert module is None and "pip uninstall -y dihal_fast dihal_fast_cu13" in reason
    monkeypatch.setattr(_native, "installed_variants", lambda: ("dihal_fast",))
    assert _native.variant_conflict() == ""


def test_wheel_variants_pin_cuda_and_architectures():
    import tomllib

    wheel_variant = _wheel_variant()
    assert wheel_variant.architectures({80, 90}) == "80-real;90"
    assert wheel_variant.architectures({80, 90, 100, 120}) == "80-real;90-real;100-real;120"
    original = (ROOT / "pyproject.toml").read_text()
    for variant, cuda, pin in (("cpu", "OFF", None), ("cu12", "ON", "<13"), ("cu13", "ON", "<14")):
        config = tomllib.loads(wheel_variant.apply(original, variant, {80, 90, 100, 120}))
        defines = config["tool"]["scikit-build"]["cmake"]["define"]
        assert defines["DIHAL_CUDA"] == cuda
        if pin:
            assert defines["DIHAL_CUDA_ARCHITECTURES"] == "80-real;90-real;100-real;120"
            assert any(
                dep.startswith("nvidia-cublas") and dep.endswith(pin) for dep in config["project"]["dependencies"]
            )


@pytest.mark.parametrize(
    ("variant", "release", "requirement"),
    [
        ("cu13", "26.10", "libcuvs-cu13==26.10.*"),
        ("cu12", "26.10", "libcuvs-cu12==26.10.*"),
        ("cu12", "none", ""),
        ("cpu", "26.10", ""),
    ],
)
def test_wheel_variants_build_cuvs_from_build_requirements(variant, release, requirement):
    """cibuildwheel's isolated build gets cuVS's headers and librmm from a build requirement."""
    import tomllib

    wheel_variant = _wheel_variant()
    original = (ROOT / "pyproject.toml").read_text()
    base = tomllib.loads(original)["build-system"]["requires"]
    # applied once before with another release, as cibuildwheel's before-build runs per Python on one copy
    other = wheel_variant.apply(original, variant, {80, 90}, "none" if release != "none" else "26.10")
    config = tomllib.loads(wheel_variant.apply(other, variant, {80, 90}, release))
    requires = config["build-system"]["requires"]
    assert requires == base + ([requirement] if requirement else [])
    if variant != "cpu":
        assert config["tool"]["scikit-build"]["cmake"]["define"]["DIHAL_CUVS"] == ("ON" if requirement else "OFF")
    with pytest.raises(ValueError, match="CUVS_RELEASE"):
        wheel_variant.cuvs_build_requirement("cu13", "26.10.0")
