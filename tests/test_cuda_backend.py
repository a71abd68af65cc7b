"""CUDA backend: build and availability reporting (run everywhere), the kNN logic of the kernels
through their host emulation compiled into the CPU module (run everywhere, no nvcc needed), and
every CUDA operation against
``dihal_fast.reference`` (needs a GPU; skipped with the reason from ``build_info()`` otherwise,
or turned into failures with DIHAL_REQUIRE_GPU=1 as bench/gpu_check.sh does)."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dihal_fast as df
from dihal_fast import _native, reference
from dihal_fast.geometry import backend_cuda
from dihal_fast.geometry.backends import get_backend

torch = pytest.importorskip("torch")

CUDA_INFO = df.build_info()["backends"]["cuda"]
REQUIRE_GPU = os.environ.get("DIHAL_REQUIRE_GPU") == "1"


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
    with pytest.raises(df.BackendUnavailable, match="CUDA"):
        df.knn(X, 3, backend=backend)
    with pytest.raises(df.BackendUnavailable, match="CUDA"):
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
    if capability >= (8, 0):
        assert "nvidia-cublas" in str(err.value) and "/nonexistent/libcublas.so.13" in str(err.value)
    else:
        assert "sm_75" in str(err.value)


def test_cuvs_backend_without_cuvs_says_what_to_install():
    module = _cuda_module()
    if module.build_info()["cuvs_compiled"]:
        pytest.skip("this build has cuVS")
    with pytest.raises(df.BackendUnavailable, match="libcuvs"):
        backend_cuda._load_cuvs(module)


def test_library_candidates_try_sonames_first():
    candidates = backend_cuda._library_candidates("libcublas", (13, 12), ("cu13/lib",))
    assert candidates[:2] == ["libcublas.so.13", "libcublas.so.12"]


@pytest.mark.parametrize("variant", ["cpu", "cu12", "cu13"])
def test_wheel_variants_rewrite_pyproject(variant):
    import importlib.util
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("wheel_variant", root / "csrc" / "cuda" / "wheel_variant.py")
    wheel_variant = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wheel_variant)
    original = (root / "pyproject.toml").read_text()
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


# ---------------------------------------------------------------- kernel logic on the host (any machine)
def _check_against_reference(X: np.ndarray, idx, d2, flags, k: int) -> None:
    ref_idx, ref_d2 = reference.knn(X, k)
    ok = flags == 0
    np.testing.assert_array_equal(idx[ok], ref_idx[ok])
    np.testing.assert_allclose(d2[ok], ref_d2[ok], rtol=1e-12, atol=1e-300)


@given(
    n=st.integers(2, 70),
    D=st.integers(1, 9),
    kind=st.sampled_from(["normal", "duplicates", "grid", "low_rank"]),
    dtype=st.sampled_from([np.float32, np.float64]),
    data=st.data(),
)
def test_emulated_knn_kernel_matches_reference(n, D, kind, dtype, data):
    k = data.draw(st.integers(1, n - 1))
    query_block, ref_block = data.draw(st.integers(1, n)), data.draw(st.integers(1, n))
    splits = data.draw(st.integers(1, 8))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    if kind == "duplicates":
        X = np.repeat(rng.standard_normal((max(1, n // 3), D)), 3, axis=0)[:n]
        X = np.concatenate([X, rng.standard_normal((n - len(X), D))])
    elif kind == "grid":
        X = rng.integers(-2, 3, size=(n, D)).astype(float)
    elif kind == "low_rank":
        X = rng.standard_normal((n, 1)) @ rng.standard_normal((1, D)) * 100 + 1e3
    else:
        X = rng.standard_normal((n, D)) * 10.0 ** rng.uniform(-3, 3)
    X = np.ascontiguousarray(X, dtype=dtype)
    idx, d2, flags = _native.core().emulate_cuda_knn(X, k, query_block, ref_block, splits)
    _check_against_reference(X, idx, d2, flags, k)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_emulated_knn_certifies_generic_data(dtype):
    X = np.random.default_rng(1).standard_normal((400, 24)).astype(dtype)
    idx, d2, flags = _native.core().emulate_cuda_knn(X, 16, 128, 96, 6)
    assert flags.sum() == 0, "the candidate lists should certify continuous random data"
    _check_against_reference(X, idx, d2, flags, 16)


def test_emulated_jacobi_matches_eigvalsh():
    rng = np.random.default_rng(2)
    for m in (1, 2, 5, 17, 64):
        B = rng.standard_normal((m, 3))
        A = B @ B.T  # PSD, rank <= 3
        np.testing.assert_allclose(_native.core().jacobi_top_eigenvalue(A), np.linalg.eigvalsh(A)[-1], rtol=1e-12)


@pytest.mark.parametrize("D,rank", [(300, 300), (400, 5), (500, 1), (700, 3)])
def test_lanczos_top_eigenvalue_matches_eigvalsh(D, rank):
    # The GPU backend's Lanczos is plain torch: run it on CPU tensors, including the breakdowns of
    # low-rank matrices, against a dense solver.
    ops = backend_cuda.CudaBackend.__new__(backend_cuda.CudaBackend)
    ops._torch = torch
    A = torch.randn(D, rank, generator=torch.Generator().manual_seed(D), dtype=torch.float64)
    C = A @ A.T / rank
    assert ops.top_eigenvalue(C) == pytest.approx(float(torch.linalg.eigvalsh(C)[-1]), rel=1e-12)
    single = torch.zeros(D, D, dtype=torch.float64)
    single[3, 3] = 2.0
    assert ops.top_eigenvalue(single) == pytest.approx(2.0, rel=1e-12)


# ---------------------------------------------------------------- GPU (skipped without a device)
@pytest.fixture(scope="module")
def gpu():
    if not CUDA_INFO["available"]:
        reason = f"no usable CUDA device: {CUDA_INFO['reason']}"
        if REQUIRE_GPU:
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        return get_backend("cuda")
    except df.BackendUnavailable as exc:
        if REQUIRE_GPU:
            raise
        pytest.skip(str(exc))


DTYPES = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3, "bfloat16": 2e-3}


def _gpu_matrix(n: int, D: int, dtype: str, seed: int = 0, rank: int | None = None):
    g = torch.Generator().manual_seed(seed)
    if rank is None:
        X = torch.randn(n, D, generator=g, dtype=torch.float64)
    else:
        X = torch.randn(n, rank, generator=g, dtype=torch.float64) @ torch.randn(rank, D, generator=g, dtype=torch.float64)
        X += 0.01 * torch.randn(n, D, generator=g, dtype=torch.float64)
    return X.to(getattr(torch, dtype)).cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("n,D,k", [(517, 67, 16), (300, 9, 200), (41, 3, 40)])
def test_gpu_knn_matches_reference(gpu, dtype, n, D, k):
    X = _gpu_matrix(n, D, dtype)
    for view in (X, X.T.contiguous().T):  # contiguous and column-major strides
        idx, d2 = df.knn(view, k, backend="cuda")
        ref_idx, ref_d2 = reference.knn(X, k)
        np.testing.assert_array_equal(idx, ref_idx)
        np.testing.assert_allclose(d2, ref_d2, rtol=DTYPES[dtype], atol=1e-12)


@pytest.mark.gpu
def test_gpu_knn_ties_and_duplicates(gpu):
    rng = np.random.default_rng(3)
    grid = torch.from_numpy(rng.integers(-2, 3, size=(400, 4)).astype(np.float32)).cuda()
    dup = torch.from_numpy(np.repeat(rng.standard_normal((100, 8)), 3, axis=0)).cuda()
    for X in (grid, dup):
        idx, _ = df.knn(X, 7, backend="cuda")
        np.testing.assert_array_equal(idx, reference.knn(X, 7)[0])


@pytest.mark.gpu
def test_gpu_knn_on_a_side_stream_and_cuvs(gpu):
    X = _gpu_matrix(700, 33, "float32", seed=4)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        idx, _ = df.knn(X, 10, backend="cuda")
    np.testing.assert_array_equal(idx, reference.knn(X, 10)[0])
    if not df.build_info()["backends"]["cuvs"]["available"]:
        pytest.skip("cuVS is not compiled into this build")
    np.testing.assert_array_equal(df.knn(X, 10, backend="cuvs")[0], reference.knn(X, 10)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("k", [16, 70])
def test_gpu_local_eigenvalues_match_reference(gpu, k):
    X = _gpu_matrix(300, 40, "float32", seed=5, rank=5)
    idx, _ = reference.knn(X, k)
    np.testing.assert_allclose(gpu.local_top_eigenvalues(X, idx), reference.local_top_eigenvalues(X, idx), rtol=1e-10)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("D", [64, 300])  # dense eigensolver / Lanczos
def test_gpu_proxies_match_reference(gpu, dtype, D):
    X = _gpu_matrix(600, D, dtype, seed=6, rank=8)
    got = df.geometry_proxies(X, k=16, n_pairs=2000, backend="cuda")
    want = reference.geometry_proxies(X, k=16, n_pairs=2000)
    for name in ("m_curv", "m_mono", "k_eff"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-8, err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_gpu_streaming_covariance_update(gpu, dtype):
    X = _gpu_matrix(5000, 96, dtype, seed=7, rank=10) + 3.0
    D = X.shape[1]
    mean = torch.zeros(D, dtype=torch.float64, device="cuda")
    M = torch.zeros((D, D), dtype=torch.float64, device="cuda")
    count = 0
    for part in torch.tensor_split(X, [1, 1700, 1701, 4000]):
        count = gpu.covariance_update(part, count, mean, M)
    assert count == X.shape[0]
    cov = (torch.triu(M) + torch.triu(M, 1).T).cpu().numpy() / count
    want = np.cov(reference.to_float64(X), rowvar=False, bias=True)
    tol = {"float64": 1e-10, "float32": 1e-5}.get(dtype, 2e-3)
    assert np.linalg.norm(cov - want) <= tol * np.linalg.norm(want)
    np.testing.assert_allclose(mean.cpu().numpy(), reference.to_float64(X).mean(0), rtol=1e-10, atol=1e-10)
    # host state: the same update through NumPy arrays
    host = df.StreamingCovariance(D, backend="cuda").update(reference.to_float64(X).astype(np.float32))
    assert np.linalg.norm(host.covariance - want) <= 1e-5 * np.linalg.norm(want)
