"""Geometry kernels against the NumPy float64 reference, on one backend x dtype grid.

Backends (the ``backend`` fixture): ``reference`` (the dispatch path around :mod:`dihal_fast.reference`),
``cpu`` (the C++ kernels) and ``cuda`` (the GPU kernels, marked ``gpu``; skipped with the reason from
``build_info()`` where no device is usable, turned into failures with DIHAL_REQUIRE_GPU=1 as
bench/gpu_check.sh does); ``compiled_backend`` drops the reference column where it would compare the
reference with itself. kNN has a fourth column, ``cuda-emulated``: the CUDA pipeline's candidate lists
and certification compiled into the CPU module and run on the host, so their logic is tested on every
machine; the largest eigenvalue has ``cuda-on-host``, the CUDA backend's torch Lanczos on CPU tensors.
Dtypes: every input dtype the API accepts (float16, bfloat16, float32, float64). The build and
availability reporting of the CUDA module are tested in ``test_cuda_build.py``.

Tolerances are per backend where the kernels round differently (the CUDA kNN returns distances of
low-precision rows to 2e-3); each is the one its test had before the CPU and GPU files were merged.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dihal_fast as df
from dihal_fast import _native
from dihal_fast import reference as ref
from dihal_fast.geometry import backend_cuda
from dihal_fast.geometry.backends import get_backend, symmetrize_upper
from dihal_fast.geometry.inputs import as_matrix

DTYPES = ["float16", "bfloat16", "float32", "float64"]
REQUIRE_GPU = os.environ.get("DIHAL_REQUIRE_GPU") == "1"
# Set by bench/gpu_check.sh when its probe found cuVS usable: a cuvs case that skips then is a failure.
REQUIRE_CUVS = os.environ.get("DIHAL_REQUIRE_CUVS") == "1"
GRID = ["reference", "cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# A function-scoped fixture under @given is fine here: the backend name is the same for every example.
GIVEN_WITH_BACKEND = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _require(backend: str) -> None:
    """Skip (or, for ``cuda`` under DIHAL_REQUIRE_GPU=1 and ``cuvs`` under DIHAL_REQUIRE_CUVS=1, fail) with the
    backend's own reason when it cannot run."""
    info = df.build_info()["backends"][backend]
    reason = None if info["available"] else f"backend {backend!r} cannot run here: {info['reason']}"
    if reason is None:
        try:
            get_backend(backend, "cuda" if backend == "cuda" else "cpu")
        except df.BackendUnavailable as exc:
            reason = str(exc)
    if reason is not None:
        if (REQUIRE_GPU and backend == "cuda") or (REQUIRE_CUVS and backend == "cuvs"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(params=GRID)
def backend(request) -> str:
    _require(request.param)
    return request.param


@pytest.fixture(params=GRID[1:])
def compiled_backend(request) -> str:
    """The compiled backends only: for checks whose reference column would compare the reference with itself."""
    _require(request.param)
    return request.param


@pytest.fixture(params=GRID + ["cuda-emulated"])
def knn_backend(request) -> str:
    if request.param == "cuda-emulated":
        _require("cpu")
        if not hasattr(_native.core(), "emulate_cuda_knn"):
            pytest.skip("this build's CPU module has no host emulation of the CUDA kNN")
    else:
        _require(request.param)
    return request.param


def on_backend(X, backend: str):
    """``X`` where ``backend`` reads it: a CUDA tensor for ``cuda``, unchanged for the host backends."""
    return torch.as_tensor(X).cuda() if backend == "cuda" else X


def low_rank(n: int, D: int, rank: int = 6, noise: float = 0.05, seed: int = 0, offset: float = 3.0) -> np.ndarray:
    """Low-rank-plus-noise rows with a large common offset (like hidden states)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, rank)) @ rng.normal(size=(rank, D)) + noise * rng.normal(size=(n, D))
    return X + offset * rng.normal(size=D)


def gaussian(n: int, D: int, seed: int = 0, rank: int | None = None) -> np.ndarray:
    """Standard normal rows (float64, torch's generator), or rank-``rank`` rows plus 1 % noise."""
    g = torch.Generator().manual_seed(seed)
    if rank is None:
        X = torch.randn(n, D, generator=g, dtype=torch.float64)
    else:
        X = torch.randn(n, rank, generator=g, dtype=torch.float64) @ torch.randn(
            rank, D, generator=g, dtype=torch.float64
        )
        X += 0.01 * torch.randn(n, D, generator=g, dtype=torch.float64)
    return X.numpy()


def as_dtype(X: np.ndarray, dtype: str):
    """``X`` rounded to ``dtype``: NumPy for float16/32/64, a torch tensor for bfloat16."""
    if dtype == "bfloat16":
        return torch.from_numpy(X).to(torch.bfloat16)
    return X.astype(dtype)


def column_major(X):
    """The same matrix with column-major strides (NumPy or torch)."""
    return X.T.contiguous().T if isinstance(X, torch.Tensor) else np.asfortranarray(X)


def emulate_cuda_knn(X, k: int, query_block: int = 4096, ref_block: int = 4096, splits: int = 0) -> dict:
    """The host emulation of the CUDA kNN on ``X`` (NumPy float16/32/64, or a torch bfloat16 tensor passed as its
    16-bit patterns); blocks default to the kernel's planner."""
    if isinstance(X, torch.Tensor):
        bits = X.contiguous().view(torch.int16).numpy().view(np.uint16)
        return _native.core().emulate_cuda_knn(bits, k, query_block, ref_block, splits, bfloat16=True)
    return _native.core().emulate_cuda_knn(np.ascontiguousarray(X), k, query_block, ref_block, splits)


def _check_emulated(X, out: dict, k: int) -> None:
    """Every row of the emulated CUDA kNN (certified, ``flags == 0``, or recomputed exactly as the GPU does) equals the
    reference."""
    ref_idx, ref_d2 = ref.knn(X, k)
    np.testing.assert_array_equal(out["idx"], ref_idx)
    np.testing.assert_allclose(out["sqdist"], ref_d2, rtol=1e-12, atol=1e-300)


# ---------------------------------------------------------------- kNN
KNN_CASES = [
    ("low_rank", 257, 33, 16),
    ("low_rank", 90, 7, 5),
    ("low_rank", 40, 129, 1),
    ("gaussian", 517, 67, 16),
    ("gaussian", 300, 9, 200),
    ("gaussian", 41, 3, 40),
]
CUDA_KNN_RTOL = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3, "bfloat16": 2e-3}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,n,D,k", KNN_CASES)
def test_knn_matches_reference(knn_backend, dtype, kind, n, D, k):
    rows = low_rank(n, D, seed=n + D) if kind == "low_rank" else gaussian(n, D)
    X = as_dtype(rows, dtype)
    ridx, rd2 = ref.knn(X, k)
    if knn_backend == "cuda-emulated":
        _check_emulated(X, emulate_cuda_knn(X, k, 128, 96, 6), k)
        return
    X = on_backend(X, knn_backend)
    for view in (X, column_major(X)):  # contiguous and column-major strides
        idx, d2 = df.knn(view, k, backend=knn_backend)
        np.testing.assert_array_equal(idx, ridx)
        assert d2.dtype == np.float64
        if knn_backend == "cuda":
            np.testing.assert_allclose(d2, rd2, rtol=CUDA_KNN_RTOL[dtype], atol=1e-12)
        else:
            np.testing.assert_allclose(d2, rd2, rtol=1e-6 if dtype != "float64" else 1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_knn_rowwise_and_symmetric_passes_agree(dtype):
    """The two candidate passes of the C++ kernel (block-symmetric and row-wise) give the reference."""
    core = pytest.importorskip("dihal_fast._core")
    X = low_rank(1300, 20, seed=11).astype(dtype)  # several 512-row blocks, ragged last block
    ridx, rd2 = ref.knn(X, 7)
    for symmetric in (True, False):
        idx, d2 = core.knn(X, 7, symmetric)
        np.testing.assert_array_equal(idx, ridx)
        np.testing.assert_allclose(d2, rd2, rtol=1e-12)


def _tied_rows(kind: str) -> np.ndarray:
    rng = np.random.default_rng({"shuffled_duplicates": 1, "grid": 3, "repeated": 3}[kind])
    if kind == "shuffled_duplicates":
        base = rng.normal(size=(30, 12))
        X = np.concatenate([base, base[:10], base[:10], base[:5]]).astype(np.float32)  # many exact ties
        rng.shuffle(X)
        return X
    if kind == "grid":
        return rng.integers(-2, 3, size=(400, 4)).astype(np.float32)
    rng.integers(-2, 3, size=(400, 4))  # the draws of "grid" first: the same rows as before the merge
    return np.repeat(rng.standard_normal((100, 8)), 3, axis=0)


@pytest.mark.parametrize("kind,k", [("shuffled_duplicates", 4), ("grid", 7), ("repeated", 7)])
def test_knn_ties_to_lower_index(backend, kind, k):
    X = _tied_rows(kind)
    idx, d2 = df.knn(on_backend(X, backend), k, backend=backend)
    ridx, rd2 = ref.knn(X, k)
    np.testing.assert_array_equal(idx, ridx)
    if kind == "shuffled_duplicates" and backend != "cuda":
        np.testing.assert_allclose(d2, rd2, rtol=1e-12)


def test_knn_large_offset_small_gaps(backend):
    """Clusters far from the origin with tiny within-cluster gaps: float32 GEMM alone would misorder."""
    rng = np.random.default_rng(2)
    centres = 1e3 * rng.normal(size=(20, 64))
    X = (np.repeat(centres, 25, axis=0) + 1e-2 * rng.normal(size=(500, 64))).astype(np.float32)
    np.testing.assert_array_equal(df.knn(on_backend(X, backend), 8, backend=backend)[0], ref.knn(X, 8)[0])


@pytest.mark.gpu
def test_gpu_knn_on_a_side_stream_and_cuvs():
    _require("cuda")
    X = torch.from_numpy(gaussian(700, 33, seed=4)).float().cuda()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        idx, _ = df.knn(X, 10, backend="cuda")
    np.testing.assert_array_equal(idx, ref.knn(X, 10)[0])
    _require("cuvs")
    np.testing.assert_array_equal(df.knn(X, 10, backend="cuvs")[0], ref.knn(X, 10)[0])


@given(
    n=st.integers(2, 70),
    D=st.integers(1, 9),
    kind=st.sampled_from(["normal", "duplicates", "grid", "low_rank"]),
    dtype=st.sampled_from([np.float32, np.float64]),
    data=st.data(),
)
def test_emulated_cuda_knn_blocks_and_splits(n, D, kind, dtype, data):
    """The CUDA kNN's host emulation on every block size and split of the reference rows."""
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
    _check_emulated(X, emulate_cuda_knn(X, k, query_block, ref_block, splits), k)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_emulated_cuda_knn_certifies_generic_data(dtype):
    X = np.random.default_rng(1).standard_normal((400, 24)).astype(dtype)
    out = emulate_cuda_knn(X, 16, 128, 96, 6)
    assert out["flags"].sum() == 0, "the candidate lists should certify continuous random data"
    _check_emulated(X, out, 16)


# ---------------------------------------------------------------- the kNN certificate on adversarial rows
# The kNN certificate (csrc/knn_logic.hpp) on adversarial rows, on every backend that runs here.
#
# The candidates of the compiled kNN come from low-precision dot products; a row is *certified* when its list
# threshold exceeds ``certify_limit`` (the k-th exact distance plus a proven rounding bound), and recomputed exactly
# otherwise. These families are built to make the dot products err as much as they can: constant rows with exact
# duplicates (a sequential accumulation of ``D`` equal terms errs by ``O(D u)``, not ``O(sqrt(D) u)``), mirrored
# clusters (the mean is exactly zero, so centring does not help), integer-quantised rows with ties and a large common
# offset. Every row of every backend must equal the float64 reference (indices, ties to the lower index; distances).
# ``cuda-emulated`` is the CUDA pipeline on the host with one sequential FMA accumulation per dot product, as one cuBLAS
# thread computes it; ``test_old_bound_certified_a_wrong_answer`` shows that the previous estimate
# ``(4 sqrt(D) + 8) u (|x_i|^2 + max |x_j|^2)`` certified a wrong neighbour there and the proven bound does not.
# On a GPU, bench/gpu_check.sh runs the ``cuda`` and ``cuvs`` columns (``gpu`` marker).
U32 = 2.0**-24  # float32 unit roundoff


def constant_duplicates(D: int, seed: int = 0, n_near: int = 40) -> np.ndarray:
    """A query with constant coordinates (0.96710527, whose sequential float32 sum of squares over 8192 terms errs
    the most among nearby constants), its exact duplicate, one very near point, ``n_near - 1`` near points at
    squared distances 0.5 .. 1.2 (scaled units), and the mirror image of all of them (so the mean is exactly 0)."""
    rng = np.random.default_rng(seed)
    q = np.full(D, np.float32(0.9671052694320679), dtype=np.float64)
    eps = np.r_[0.001, np.linspace(0.0135, 0.021, n_near - 1)] * np.sqrt(8192 / D)
    near = q + eps[:, None] * rng.uniform(-1, 1, size=(n_near, D))
    pos = np.vstack([q, q, near])
    return np.vstack([pos, -pos])


def mirrored_clusters(D: int, seed: int = 1) -> np.ndarray:
    """Tight clusters at +c and -c around a constant-coordinate centre, each point duplicated once."""
    rng = np.random.default_rng(seed)
    centres = 0.9 + 0.05 * rng.uniform(size=(4, 1)) * np.ones((1, D))
    pts = np.repeat(centres, 6, axis=0) + 1e-3 * rng.standard_normal((24, D))
    pts = np.vstack([pts, pts[::3]])
    return np.vstack([pts, -pts])


def quantised_ties(D: int, seed: int = 2) -> np.ndarray:
    """Integer rows in -3..3 with repeated rows: exact distance ties everywhere."""
    rng = np.random.default_rng(seed)
    base = rng.integers(-3, 4, size=(30, D)).astype(np.float64)
    base[:, : D // 2] = 3.0  # half the coordinates constant: long runs of equal terms
    return np.vstack([base, base[:12], base[:6]])[rng.permutation(48)]


def large_offset(D: int, seed: int = 3) -> np.ndarray:
    """A common offset 1e4 with spreads of 1e-2, duplicates included: the GEMM sees only the centred rows."""
    rng = np.random.default_rng(seed)
    X = 1e4 + 1e-2 * rng.standard_normal((40, D))
    return np.vstack([X, X[:8]])


FAMILIES = {
    "constant_duplicates": constant_duplicates,
    "mirrored_clusters": mirrored_clusters,
    "quantised_ties": quantised_ties,
    "large_offset": large_offset,
}
CASES = [(family, D) for family in FAMILIES for D in (64, 8192)]


def _rows(family: str, D: int, dtype: str):
    X = FAMILIES[family](D)
    return torch.from_numpy(X).to(torch.bfloat16) if dtype == "bfloat16" else X.astype(dtype)


def _assert_reference(X, idx, d2, k: int, rtol: float) -> None:
    ridx, rd2 = ref.knn(X, k)
    np.testing.assert_array_equal(idx, ridx)
    np.testing.assert_allclose(d2, rd2, rtol=rtol, atol=1e-300)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("family,D", CASES)
@pytest.mark.parametrize(
    "backend",
    [
        "reference",
        "cpu",
        "cuda-emulated",
        pytest.param("cuda", marks=pytest.mark.gpu),
        pytest.param("cuvs", marks=pytest.mark.gpu),
    ],
)
def test_adversarial_rows_match_reference(backend, family, D, dtype):
    X = _rows(family, D, dtype)
    k = 3
    if backend == "cuda-emulated":
        _require("cpu")
        out = emulate_cuda_knn(X, k)
        _assert_reference(X, out["idx"], out["sqdist"], k, rtol=1e-12)
        return
    _require(backend)
    rtol = 1e-12 if dtype == "float64" else 1e-6
    if backend not in ("cuda", "cuvs"):
        idx, d2 = df.knn(X, k, backend=backend)
        _assert_reference(X, idx, d2, k, rtol=rtol)
        return
    # bench/gpu_check.sh runs these with TF32 allowed (DIHAL_TEST_TF32=1) and not.
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = matmul.allow_tf32, cudnn.allow_tf32
    matmul.allow_tf32 = cudnn.allow_tf32 = os.environ.get("DIHAL_TEST_TF32") == "1"
    try:
        idx, d2 = df.knn(torch.from_numpy(X).cuda(), k, backend=backend)
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved
    _assert_reference(X, idx, d2, k, rtol=rtol)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_adversarial_low_precision_rows_emulated(family, dtype):
    """float16/bfloat16 rows as the CUDA kernels read them (exact float64 distances of the rounded values)."""
    _require("cpu")
    X = _rows(family, 1024, dtype)
    out = emulate_cuda_knn(X, 3)
    _assert_reference(X, out["idx"], out["sqdist"], 3, rtol=1e-12)


def _old_certified(out: dict, D: int) -> np.ndarray:
    """The rows the previous estimate (4 sqrt(D) + 8) u (|x_i|^2 + max |x_j|^2) certified."""
    bound = (4 * np.sqrt(D) + 8) * U32 * (out["norms"] + out["max_norm2"])
    return out["kth_scaled"] < out["threshold"] - bound


def test_old_bound_certified_a_wrong_answer():
    """On constant rows with an exact duplicate at D = 8192 (float32), one sequential FMA accumulation per dot product
    puts the duplicate (true distance 0) behind 17 near points; the old estimate certified the wrong neighbour, the
    proven bound flags those rows for the exact recomputation."""
    _require("cpu")
    X = constant_duplicates(8192).astype(np.float32)
    out = emulate_cuda_knn(X, 1)
    ridx, _ = ref.knn(X, 1)
    wrong = (out["cand_idx"] != ridx).any(axis=1)
    old = _old_certified(out, 8192)
    assert (old & wrong).any(), "the family no longer fools the old estimate"
    assert out["flags"][wrong].all(), "the proven bound certified a wrong candidate answer"
    np.testing.assert_array_equal(out["idx"], ridx)
    # The duplicate's approximate distance: 2 |q|^2 - 2 fl(q . q) with fl a sequential float32 FMA sum.
    q = X[0].astype(np.float64)
    acc = np.float32(0)
    for v in q * q:
        acc = np.float32(float(acc) + v)  # exact product, one rounding per step (an FMA)
    dup = 2 * float(np.float32(q @ q)) - 2 * float(acc)
    assert dup > out["threshold"][0] > out["kth_scaled"][0] + (4 * np.sqrt(8192) + 8) * U32 * 2 * out["max_norm2"]


@pytest.mark.parametrize("path", ["gemm32", "gemm64", "gram", "cuvs"])
def test_certify_limit_is_at_least_the_measured_error(path):
    """certify_limit(K) - K bounds |approximate - exact| distance of the rows of the duplicate family (for the FMA
    accumulation that makes the largest error there), and grows with D and with the norms."""
    core = _native.core()
    D = 8192
    X = constant_duplicates(D).astype(np.float32)
    out = emulate_cuda_knn(X, 1)
    q = X[0].astype(np.float64)
    acc = np.float32(0)
    for v in q * q:
        acc = np.float32(float(acc) + v)
    measured = abs(2 * float(np.float32(q @ q)) - 2 * float(acc))
    slack = core.knn_certify_limit(path, D, 0.0, out["norms"][0], out["max_norm2"])
    if path in ("gemm32", "cuvs"):
        assert slack > measured
    assert core.knn_certify_limit(path, 2 * D, 0.0, 1.0, 1.0) > core.knn_certify_limit(path, D, 0.0, 1.0, 1.0)
    assert core.knn_certify_limit(path, D, 0.0, 2.0, 2.0) > core.knn_certify_limit(path, D, 0.0, 1.0, 1.0)
    assert core.knn_certify_limit(path, D, 0.5, 1.0, 1.0) > 0.5
    with pytest.raises(ValueError, match="path must be"):
        core.knn_certify_limit("tf32", D, 0.0, 1.0, 1.0)


def test_emulated_multi_tile_planner_paths():
    """Multi-tile paths with ragged edges: the kernel's own planner past one 4096-row tile (two query blocks, two
    reference tiles, the last 300 rows ragged), and small blocks with several splits on D = 2048 rows."""
    _require("cpu")
    rng = np.random.default_rng(5)
    X = (rng.standard_normal((4396, 4)) * [1.0, 0.1, 0.01, 3.0] + 5.0).astype(np.float32)
    X[4000:4100] = X[:100]  # exact duplicates across the two tiles
    out = emulate_cuda_knn(X, 5)
    assert out["plan"][:2] == (4096, 4096)
    _assert_reference(X, out["idx"], out["sqdist"], 5, rtol=1e-12)
    Y = mirrored_clusters(2048).astype(np.float32)
    for blocks in ((17, 23, 3), (50, 7, 1), (60, 60, 0)):
        small = emulate_cuda_knn(Y, 4, *blocks)
        _assert_reference(Y, small["idx"], small["sqdist"], 4, rtol=1e-12)


@pytest.mark.parametrize("family", list(FAMILIES) + ["gaussian"])
def test_gemm_fallback_on_host_tensors(family):
    """The CUDA backend's fallback (blocked float64 GEMM candidates, certified by the Gram model) on CPU tensors: every
    row it certifies equals the reference, and on generic rows it certifies all of them."""
    _require("cpu")
    X = torch.from_numpy(gaussian(300, 40) if family == "gaussian" else FAMILIES[family](512)).float()
    n, k = X.shape[0], 4
    idx = torch.full((n, k), -1, dtype=torch.int64)
    d2 = torch.zeros((n, k), dtype=torch.float64)
    ok = backend_cuda.gemm_candidates(X, torch.arange(n), k, 20, idx, d2)
    ridx, rd2 = ref.knn(X, k)
    np.testing.assert_array_equal(idx[ok].numpy(), ridx[ok.numpy()])
    np.testing.assert_allclose(d2[ok].numpy(), rd2[ok.numpy()], rtol=1e-12)
    if family == "gaussian":
        assert bool(ok.all())


@pytest.mark.gpu
def test_gpu_float16_covariance_near_the_float16_range():
    """float16 rows up to +-60000 around a mean of 0: centred values reach 1.2e5 (beyond float16's 65504) and their
    float32 products 3.6e9; the CUDA covariance scales such blocks by a power of two and matches the reference."""
    _require("cuda")
    rng = np.random.default_rng(4)
    X = np.concatenate([np.full((600, 8), 60000.0), np.full((600, 8), -60000.0)]) + rng.integers(-8, 8, (1200, 8))
    X16 = torch.from_numpy(X.astype(np.float16)).cuda()
    cov = df.StreamingCovariance(8, backend="cuda")
    cov.update(X16)
    Xr = ref.to_float64(X16)
    want = np.cov(Xr.T, bias=True)
    np.testing.assert_allclose(cov.covariance, want, rtol=1e-6)


# ---------------------------------------------------------------- the proxies
@pytest.mark.parametrize("layout", ["strided", "fortran", "torch_strided", "torch_transposed"])
def test_non_contiguous_inputs(backend, layout):
    X = low_rank(120, 40, seed=3)
    if backend == "cuda" and not layout.startswith("torch"):
        pytest.skip("NumPy arrays live on the host: the cuda backend reads CUDA tensors")
    base = torch.from_numpy(X) if backend != "cuda" else torch.from_numpy(X).cuda()
    view = {
        "strided": lambda: X[::2, ::2],
        "fortran": lambda: np.asfortranarray(X),
        "torch_strided": lambda: base[1::2, ::3],
        "torch_transposed": lambda: base.T.contiguous().T,
    }[layout]()
    dense = ref.to_float64(view)
    np.testing.assert_array_equal(df.knn(view, 6, backend=backend)[0], ref.knn(dense, 6)[0])
    got, want = (
        df.geometry_proxies(view, k=6, n_pairs=500, backend=backend),
        ref.geometry_proxies(dense, k=6, n_pairs=500),
    )
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-9)


# (rows, proxy keyword arguments, relative tolerance)
PROXY_CASES = {
    "low_rank_300x48": (lambda: low_rank(300, 48, seed=4), dict(k=16, n_pairs=2000, seed=7), 1e-9),
    "rank8_600x64": (
        lambda: gaussian(600, 64, seed=6, rank=8),
        dict(k=16, n_pairs=2000),
        1e-8,
    ),  # dense eigensolver on GPU
    "rank8_600x300": (lambda: gaussian(600, 300, seed=6, rank=8), dict(k=16, n_pairs=2000), 1e-8),  # Lanczos on GPU
}


@functools.cache
def _proxy_case(case: str, dtype: str):
    """(rows in ``dtype``, keyword arguments, tolerance, reference proxies): computed once for all backends."""
    rows, kwargs, rel = PROXY_CASES[case]
    X = as_dtype(rows(), dtype)
    return X, kwargs, rel, ref.geometry_proxies(X, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(PROXY_CASES))
def test_geometry_proxies_match_reference(backend, dtype, case):
    X, kwargs, rel, want = _proxy_case(case, dtype)
    got = df.geometry_proxies(on_backend(X, backend), backend=backend, **kwargs)
    assert set(got) == {"m_curv", "m_mono", "k_eff"}
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=rel, abs=0), key  # no absolute floor: as assert_allclose


def test_single_proxies_agree_with_combined(backend):
    X = on_backend(low_rank(200, 30, seed=5).astype(np.float32), backend)
    combined = df.geometry_proxies(X, k=8, ridge=1e-2, n_pairs=1000, seed=3, backend=backend)
    assert df.curvature_proxy(X, k=8, backend=backend) == pytest.approx(combined["m_curv"], rel=1e-12)
    assert df.monotonicity_proxy(X, ridge=1e-2, n_pairs=1000, seed=3, backend=backend) == pytest.approx(
        combined["m_mono"], rel=1e-12
    )
    assert df.effective_rank(X, backend=backend) == pytest.approx(combined["k_eff"], rel=1e-12)


def test_duplicate_rows_give_finite_proxies(backend):
    rng = np.random.default_rng(6)
    X = np.repeat(rng.normal(size=(10, 16)), 20, axis=0)  # every neighbourhood is one point: lambda = 0
    got = df.geometry_proxies(on_backend(X, backend), k=16, n_pairs=3000, backend=backend)
    want = ref.geometry_proxies(X, k=16, n_pairs=3000)
    assert all(np.isfinite(v) and v > 0 for v in got.values())
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-9)


def test_rank_one_data(backend):
    rng = np.random.default_rng(7)
    X = np.outer(rng.normal(size=150), rng.normal(size=20))
    assert df.effective_rank(on_backend(X, backend), backend=backend) == pytest.approx(1.0, rel=1e-9)
    assert df.geometry_proxies(on_backend(X, backend), k=4, backend=backend)["k_eff"] == pytest.approx(
        ref.effective_rank(X), rel=1e-9
    )


@GIVEN_WITH_BACKEND
@given(
    n=st.integers(2, 40),
    D=st.integers(1, 24),
    k_frac=st.floats(0, 1),
    dtype=st.sampled_from(["float32", "float64"]),
    seed=st.integers(0, 2**16),
)
def test_property_knn_and_proxies(backend, n, D, k_frac, dtype, seed):
    k = 1 + int(k_frac * (n - 2))
    X = np.random.default_rng(seed).normal(size=(n, D)).astype(dtype)
    idx, d2 = df.knn(on_backend(X, backend), k, backend=backend)
    ridx, rd2 = ref.knn(X, k)
    assert idx.shape == (n, k) and idx.dtype == np.int64
    np.testing.assert_array_equal(idx, ridx)  # continuous random data: no exact ties
    np.testing.assert_allclose(d2, rd2, rtol=1e-6, atol=1e-12)
    got = df.geometry_proxies(on_backend(X, backend), k=k, n_pairs=200, seed=seed, backend=backend)
    want = ref.geometry_proxies(X, k=k, n_pairs=200, seed=seed)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-7), key


# ---------------------------------------------------------------- backend operations
def _ops(backend: str):
    return get_backend(backend, "cuda" if backend == "cuda" else "cpu")


def _prepared(X, backend: str):
    """``X`` as the public functions hand it to ``backend`` (host: C-contiguous float32/float64)."""
    return as_matrix(on_backend(X, backend), allow_cuda=backend == "cuda").data


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k", [16, 70])
def test_local_top_eigenvalues_match_reference(compiled_backend, dtype, k):
    X = as_dtype(gaussian(300, 40, seed=5, rank=5), dtype)
    idx, _ = ref.knn(X, k)
    got = _ops(compiled_backend).local_top_eigenvalues(_prepared(X, compiled_backend), idx)
    np.testing.assert_allclose(got, ref.local_top_eigenvalues(X, idx), rtol=1e-10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_streaming_covariance_update(backend, dtype):
    rows = as_dtype(gaussian(5000, 96, seed=7, rank=10), dtype) + 3.0  # the offset added in the input dtype
    X = _prepared(rows, backend)
    D = X.shape[1]
    if backend == "cuda":
        mean = torch.zeros(D, dtype=torch.float64, device="cuda")
        M = torch.zeros((D, D), dtype=torch.float64, device="cuda")
    else:
        mean, M = np.zeros(D), np.zeros((D, D))
    count, bounds = 0, [0, 1, 1700, 1701, 4000, X.shape[0]]
    for start, stop in zip(bounds, bounds[1:]):
        count = _ops(backend).covariance_update(X[start:stop], count, mean, M)
    assert count == X.shape[0]
    cov = symmetrize_upper(ref.to_float64(M)) / count
    want = np.cov(ref.to_float64(rows), rowvar=False, bias=True)
    tol = {"float64": 1e-10, "float32": 1e-5}.get(dtype, 2e-3)
    assert np.linalg.norm(cov - want) <= tol * np.linalg.norm(want)
    np.testing.assert_allclose(ref.to_float64(mean), ref.to_float64(rows).mean(0), rtol=1e-10, atol=1e-10)
    # host state: the same update through NumPy arrays
    host = df.StreamingCovariance(D, backend=backend).update(ref.to_float64(rows).astype(np.float32))
    assert np.linalg.norm(host.covariance - want) <= 1e-5 * np.linalg.norm(want)


def _cuda_lanczos_on_host():
    """The CUDA backend's Lanczos (plain torch) on CPU tensors: runs without a GPU."""
    ops = backend_cuda.CudaBackend.__new__(backend_cuda.CudaBackend)
    ops._torch = torch
    return ops


@pytest.mark.parametrize("D,rank", [(300, 300), (400, 5), (500, 1), (700, 3)])
@pytest.mark.parametrize("solver", GRID + ["cuda-on-host"])
def test_top_eigenvalue_matches_eigvalsh(solver, D, rank):
    """Largest eigenvalue of PSD matrices, including the Lanczos breakdowns of low-rank ones."""
    if solver == "cuda-on-host":
        ops, device = _cuda_lanczos_on_host(), "cpu"
    else:
        _require(solver)
        ops, device = _ops(solver), "cuda" if solver == "cuda" else "cpu"
    A = torch.randn(D, rank, generator=torch.Generator().manual_seed(D), dtype=torch.float64)
    C = A @ A.T / rank
    single = torch.zeros(D, D, dtype=torch.float64)
    single[3, 3] = 2.0
    as_input = (lambda M: M.to(device)) if solver.startswith("cuda") else (lambda M: M.numpy())
    assert ops.top_eigenvalue(as_input(C)) == pytest.approx(float(torch.linalg.eigvalsh(C)[-1]), rel=1e-12)
    assert ops.top_eigenvalue(as_input(single)) == pytest.approx(2.0, rel=1e-12)


def test_top_eigenvalue_small_and_lanczos():
    core = pytest.importorskip("dihal_fast._core")
    rng = np.random.default_rng(8)
    for m in (1, 2, 5, 17, 40):
        A = rng.normal(size=(m, m))
        A = A + A.T
        assert core.top_eigenvalue_small(A) == pytest.approx(np.linalg.eigvalsh(A)[-1], rel=1e-12, abs=1e-12)
    # Clustered top of the spectrum: Lanczos must still converge to the largest.
    Q, _ = np.linalg.qr(rng.normal(size=(200, 200)))
    ev = np.concatenate([[10.0, 10.0 - 1e-6, 9.9], rng.uniform(0, 5, size=197)])
    S = (Q * ev) @ Q.T
    value, iterations = core.top_eigenvalue_psd(S)
    assert value == pytest.approx(10.0, rel=1e-10)
    assert 1 <= iterations <= 200


def test_emulated_jacobi_matches_eigvalsh():
    """The Jacobi eigensolver of the CUDA local-curvature kernel, on the host."""
    rng = np.random.default_rng(2)
    for m in (1, 2, 5, 17, 64):
        B = rng.standard_normal((m, 3))
        A = B @ B.T  # PSD, rank <= 3
        np.testing.assert_allclose(_native.core().jacobi_top_eigenvalue(A), np.linalg.eigvalsh(A)[-1], rtol=1e-12)


# ---------------------------------------------------------------- real hidden states
def _hidden_states(model_dir, texts: list[str]) -> list[np.ndarray]:
    """Every layer's hidden states (padding and the first position dropped) of a local checkpoint."""
    from dihal_fast.common.hf_loading import load_causal_lm

    model, tokenizer = load_causal_lm(model_dir)
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    keep = batch["attention_mask"].bool().clone()
    keep[:, 0] = False
    return [h[keep].numpy() for h in out.hidden_states]


@pytest.fixture(scope="module")
def real_text(shared_data) -> list[str]:
    text = (shared_data / "text" / "tinystories.valid.txt").read_text().split("\n\n")
    return [t for t in text if len(t) > 200][:12]


def test_proxies_on_hidden_states_of_a_transformers_model(compiled_backend, tiny_checkpoints, real_text):
    """Kernels against the reference on real activations: the shipped backbone when present, else a tiny Llama."""
    from dihal_fast.backbone import DEFAULT_MODEL_DIR

    model_dir = DEFAULT_MODEL_DIR if (DEFAULT_MODEL_DIR / "config.json").is_file() else tiny_checkpoints["llama"]
    layers = _hidden_states(model_dir, real_text)
    assert len(layers) >= 3
    for H in (layers[1], layers[-1]):
        H = H[:400]
        np.testing.assert_array_equal(
            df.knn(on_backend(H, compiled_backend), 16, backend=compiled_backend)[0], ref.knn(H, 16)[0]
        )
        got = df.geometry_proxies(on_backend(H, compiled_backend), n_pairs=3000, backend=compiled_backend)
        want = ref.geometry_proxies(H, n_pairs=3000)
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-8), key
        half = torch.from_numpy(H).to(torch.bfloat16)
        got16 = df.geometry_proxies(on_backend(half, compiled_backend), n_pairs=3000, backend=compiled_backend)
        want16 = ref.geometry_proxies(half, n_pairs=3000)
        for key in want16:
            assert got16[key] == pytest.approx(want16[key], rel=1e-8), key


# Magnitudes from near the smallest to near the largest float64, powers of two and not (issue 21:
# k_eff was 7.63 instead of 6.10 at 1e77, "zero variance" was claimed at 1e-200).
EXTREME_SCALES = [
    2.0**-1000,
    1e-300,
    1e-200,
    1e-150,
    1e-90,
    2.0**-70,
    1e-30,
    3.7,
    1e30,
    2.0**70,
    1e77,
    1e150,
    1e200,
    1e300,
    2.0**1000,
]


def _unit_power_of_two(Y: np.ndarray) -> tuple[np.ndarray, int]:
    """``Y * 2^-e`` with its largest |y| in [0.5, 1) (exact) and ``e``."""
    e = int(np.frexp(np.abs(Y).max())[1])
    return np.ldexp(Y, -e), e


def test_the_reference_follows_the_proxies_scaling_laws():
    """Where the reference is exact (moderate magnitudes): X -> sX keeps k_eff, divides m_mono and m_curv by s^2."""
    X = gaussian(150, 10, seed=3)
    base = ref.geometry_proxies(X, k=8, n_pairs=500)
    for s in (2.0**-40, 1e-20, 7.0, 1e20, 2.0**40):
        got = ref.geometry_proxies(X * s, k=8, n_pairs=500)
        assert got["k_eff"] == pytest.approx(base["k_eff"], rel=1e-9)
        for name in ("m_mono", "m_curv"):
            assert got[name] == pytest.approx(base[name] / s**2, rel=1e-9), (name, s)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("scale", EXTREME_SCALES)
def test_proxies_and_knn_at_extreme_scales(backend, dtype, scale):
    """Against the reference on the same rows brought to unit magnitude by an exact power of two and mapped back
    by the scaling laws; a proxy whose true value is not a normal float64 is a ValueError saying so."""
    if dtype == "float32" and not 1e-30 <= scale <= 1e30:
        pytest.skip("float32 cannot hold rows of this magnitude")
    Y = (gaussian(120, 8, seed=11) * scale).astype(dtype)
    Z, e = _unit_power_of_two(Y.astype(np.float64))
    want = ref.geometry_proxies(Z, k=8, n_pairs=500)
    rel = 1e-9 if dtype == "float64" else 1e-4
    assert df.effective_rank(on_backend(Y, backend), backend=backend) == pytest.approx(want["k_eff"], rel=rel)
    with np.errstate(over="ignore"):
        true_m = {name: np.ldexp(want[name], -2 * e) for name in ("m_mono", "m_curv")}
    if all(np.finfo(np.float64).tiny <= v < np.inf for v in true_m.values()):
        got = df.geometry_proxies(on_backend(Y, backend), k=8, n_pairs=500, backend=backend)
        for name, value in true_m.items():
            assert got[name] == pytest.approx(value, rel=rel), name
    else:
        with pytest.raises(ValueError, match="outside the range of normal float64 numbers"):
            df.geometry_proxies(on_backend(Y, backend), k=8, n_pairs=500, backend=backend)
    idx, d2 = ref.knn(Z, 5)
    with np.errstate(over="ignore"):
        true_d2 = np.ldexp(d2, 2 * e)
    if not np.isfinite(true_d2).all():
        with pytest.raises(ValueError, match="squared distances .* overflow float64"):
            df.knn(on_backend(Y, backend), 5, backend=backend)
        return
    got_idx, got_d2 = df.knn(on_backend(Y, backend), 5, backend=backend)
    if dtype == "float64":
        np.testing.assert_array_equal(got_idx, idx)
    assert got_d2.dtype == np.float64  # float32 rows' distances beyond float32's range (1e-60, 1e60) stay right
    np.testing.assert_allclose(got_d2, true_d2, rtol=rel)
