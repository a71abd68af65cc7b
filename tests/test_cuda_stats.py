"""The certified share of the CUDA / cuVS kNN is observable: each call records how many rows the candidate kernel
certified, how many the float64 GEMM pass certified and how many were recomputed exactly, and a kernel that
certifies too few rows (or certifies wrong ones) fails the check even though the fallbacks make every answer right.

On the CPU the bookkeeping runs on the host emulation of the GPU pipeline (csrc/cpu/knn_emulation.cpp: the
kernel's candidates and flags) followed by the backend's own fallback code on CPU tensors; the GPU test runs the
real kernels.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dihal_fast import _native
from dihal_fast import reference as ref
from dihal_fast.geometry import backend_cuda


def _core():
    try:
        core = _native.core()
    except _native.BackendUnavailable as exc:
        pytest.skip(f"no compiled CPU core: {exc}")
    if not hasattr(core, "emulate_cuda_knn"):
        pytest.skip("this build's CPU module has no host emulation of the CUDA kNN")
    return core


def ordinary(n: int = 400, D: int = 24, seed: int = 0) -> np.ndarray:
    """Low-rank rows plus noise with a common offset, as hidden states are (float32)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 6)) @ rng.standard_normal((6, D)) + 0.05 * rng.standard_normal((n, D))
    return (X + 3.0 * rng.standard_normal(D)).astype(np.float32)


def exact_rows_cpu(X: torch.Tensor, k: int, idx: torch.Tensor, d2: torch.Tensor):
    """The exact fallback on the CPU: float64 distances to all rows, stable sort (ties to the lower index)."""

    def run(rows: torch.Tensor) -> None:
        out = ((X[rows].double()[:, None, :] - X.double()[None, :, :]) ** 2).sum(dim=2)
        out[torch.arange(rows.numel()), rows] = float("inf")
        values, order = torch.sort(out, dim=1, stable=True)
        idx[rows] = order[:, :k]
        d2[rows] = values[:, :k]

    return run


def emulated_call(X: np.ndarray, k: int, flags: np.ndarray | None = None, corrupt_row: int | None = None):
    """One kNN call as the GPU runs it: the emulated kernel's candidates and flags (``flags`` overrides them), rows it
    did not certify left as garbage, then the backend's fallbacks. Returns (stats, idx, d2)."""
    out = _core().emulate_cuda_knn(np.ascontiguousarray(X), k)
    kernel_flags = out["flags"].astype(np.int32) if flags is None else flags
    idx = torch.from_numpy(out["cand_idx"].astype(np.int64))
    d2 = torch.from_numpy(out["sqdist"].astype(np.float64))
    garbage = torch.from_numpy(kernel_flags != 0)
    idx[garbage], d2[garbage] = -1, float("nan")  # what the fallbacks must overwrite
    if corrupt_row is not None:  # a broken kernel: a wrong neighbour in a row it claims to have certified
        idx[corrupt_row, 0] = (idx[corrupt_row, 0] + 1) % X.shape[0]
    Xt = torch.from_numpy(X)
    capacity = int(out["plan"][3])  # (query_block, ref_block, splits, cap): the kernel's list length
    stats = backend_cuda.resolve_uncertified(
        Xt, k, torch.from_numpy(kernel_flags), capacity, idx, d2, exact_rows_cpu(Xt, k, idx, d2), "cuda"
    )
    return stats, out, idx.numpy(), d2.numpy()


def test_stats_count_every_row_once_and_the_answer_is_the_reference() -> None:
    X, k = ordinary(), 8
    stats, out, idx, d2 = emulated_call(X, k)
    flagged = int(np.count_nonzero(out["flags"]))
    assert stats.rows == X.shape[0]
    assert stats.kernel_certified == X.shape[0] - flagged
    assert stats.float64_certified + stats.exact == flagged
    np.testing.assert_array_equal(stats.kernel_rows, out["flags"] == 0)
    ref_idx, ref_d2 = ref.knn(X, k)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(d2, ref_d2, rtol=1e-12)
    assert stats.kernel_share >= backend_cuda.MIN_KERNEL_CERTIFIED_SHARE, stats.summary()
    assert backend_cuda.certified_share_problems(stats, idx, d2, ref_idx, ref_d2) == []


def test_some_uncertified_rows_are_counted_by_the_pass_that_answered_them() -> None:
    X, k = ordinary(seed=6), 8
    flags = (np.arange(X.shape[0]) % 5 == 0).astype(np.int32)  # as if the kernel gave up on every fifth row
    stats, _, idx, d2 = emulated_call(X, k, flags=flags)
    assert stats.kernel_certified == X.shape[0] - flags.sum()
    assert stats.float64_certified + stats.exact == flags.sum()
    ref_idx, ref_d2 = ref.knn(X, k)
    np.testing.assert_array_equal(idx, ref_idx)
    assert backend_cuda.certified_share_problems(stats, idx, d2, ref_idx, ref_d2)  # 80 % < 99 %


def test_a_kernel_that_certifies_nothing_fails_although_every_answer_is_right() -> None:
    X, k = ordinary(seed=1), 8
    stats, _, idx, d2 = emulated_call(X, k, flags=np.ones(X.shape[0], dtype=np.int32))
    ref_idx, ref_d2 = ref.knn(X, k)
    np.testing.assert_array_equal(idx, ref_idx)  # the fallbacks hide the broken kernel from the answer...
    assert stats.kernel_certified == 0 and stats.float64_certified + stats.exact == X.shape[0]
    problems = backend_cuda.certified_share_problems(stats, idx, d2, ref_idx, ref_d2)
    assert len(problems) == 1 and "0 of 400 rows certified by the kernel" in problems[0]  # ...not from the check


def test_a_wrong_certified_row_fails_the_check() -> None:
    X, k = ordinary(seed=2), 8
    clean, out, _, _ = emulated_call(X, k)
    row = int(np.flatnonzero(out["flags"] == 0)[3])
    stats, _, idx, d2 = emulated_call(X, k, corrupt_row=row)
    ref_idx, ref_d2 = ref.knn(X, k)
    problems = backend_cuda.certified_share_problems(stats, idx, d2, ref_idx, ref_d2)
    assert any(f"rows [{row}]" in p and "differ from the reference" in p for p in problems), problems
    assert stats.kernel_share == clean.kernel_share  # the share alone would not have caught it


def test_nan_distances_in_certified_rows_fail_the_check() -> None:
    X, k = ordinary(seed=3), 5
    stats, out, idx, d2 = emulated_call(X, k)
    ref_idx, ref_d2 = ref.knn(X, k)
    row = int(np.flatnonzero(out["flags"] == 0)[0])
    d2 = d2.copy()
    d2[row, 2] = np.nan
    problems = backend_cuda.certified_share_problems(stats, idx, d2, ref_idx, ref_d2)
    assert any(f"rows [{row}]" in p for p in problems), problems


def test_no_kernel_run_sends_every_row_to_the_fallbacks() -> None:
    X, k = ordinary(n=120, seed=4), 6
    Xt = torch.from_numpy(X)
    idx = torch.full((X.shape[0], k), -1, dtype=torch.int64)
    d2 = torch.full((X.shape[0], k), float("nan"), dtype=torch.float64)
    stats = backend_cuda.resolve_uncertified(Xt, k, None, 32, idx, d2, exact_rows_cpu(Xt, k, idx, d2), "cuvs")
    assert stats.kernel_certified == 0 and stats.float64_certified + stats.exact == X.shape[0]
    assert not stats.kernel_rows.any()
    np.testing.assert_array_equal(idx.numpy(), ref.knn(X, k)[0])
    assert stats.summary().startswith("cuvs kNN: 0 of 120 rows certified by the kernel")


def test_cublas_emulation_variables_are_refused_in_one_line() -> None:
    assert backend_cuda.cublas_emulation_refusal({"PATH": "/bin", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}) == ""
    assert backend_cuda.cublas_emulation_refusal({"CUBLAS_EMULATE_DOUBLE_PRECISION": "0"}) == ""
    for name, value in (
        ("CUBLAS_EMULATE_SINGLE_PRECISION", "1"),
        ("CUBLAS_EMULATE_DOUBLE_PRECISION", "1"),
        ("CUBLAS_EMULATION_STRATEGY", "eager"),
        ("CUBLAS_FIXEDPOINT_EMULATION_MANTISSA_BIT_COUNT", "55"),
    ):
        message = backend_cuda.cublas_emulation_refusal({name: value})
        assert f"{name}={value}" in message and "\n" not in message


def test_create_refuses_cublas_emulation_before_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    if backend_cuda.build_refusal("cuda", _native.build_info()["backends"]):
        pytest.skip("this build has no CUDA module: create() says so first (the emulation check follows it)")
    monkeypatch.setenv("CUBLAS_EMULATE_SINGLE_PRECISION", "1")

    def no_module():  # the refusal must come before the CUDA module is even looked for
        raise AssertionError("the CUDA module was loaded before the refusal")

    monkeypatch.setattr(_native, "cuda_module", no_module)
    with pytest.raises(backend_cuda.DihalValueError, match="CUBLAS_EMULATE_SINGLE_PRECISION=1"):
        backend_cuda.create("cuda")


@pytest.mark.gpu
def test_gpu_kernel_certifies_ordinary_rows() -> None:
    """The real kernels (own and cuVS) certify >= 99 % of ordinary rows, each one equal to the reference."""
    import dihal_fast as df

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    X, k = ordinary(n=4000, D=64, seed=5), 10
    ref_idx, ref_d2 = ref.knn(X, k)
    for backend in ("cuda", "cuvs"):
        try:
            idx, d2 = df.knn(torch.from_numpy(X).cuda(), k, backend=backend)
        except _native.BackendUnavailable as exc:
            if backend == "cuvs":
                continue  # cuVS is optional; the own kernel is not
            raise AssertionError(f"backend cuda unavailable on a GPU machine: {exc}") from exc
        stats = backend_cuda.last_knn_stats()
        assert stats is not None and stats.backend == backend
        assert backend_cuda.certified_share_problems(stats, np.asarray(idx), np.asarray(d2), ref_idx, ref_d2) == []
