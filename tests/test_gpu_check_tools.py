"""The GPU-run scripts on a machine without a GPU: bench/gpu_check.sh's options, summary and exit status (its
build and checks stubbed), so that a first GPU run cannot pass silently without cuVS; tools/gpu_first_run.py's
data and tolerances against a host model of the device arithmetic, so that its checks test what they claim."""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dihal_fast as df

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = ROOT / "bench" / "gpu_check.sh"
FIRST_RUN = ROOT / "tools" / "gpu_first_run.py"


def _bash(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_gpu_check_parses_and_documents_its_options():
    assert _bash("-n", str(GPU_CHECK)).returncode == 0
    shown = _bash(str(GPU_CHECK), "--help")
    assert shown.returncode == 0
    assert "--no-cuvs" in shown.stdout and "NOT RUN: cuvs (reason)" in shown.stdout
    wrong = _bash(str(GPU_CHECK), "--no-cuda")
    assert wrong.returncode == 2 and "unknown option: --no-cuda" in wrong.stderr


def _stubbed_gpu_check(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of gpu_check.sh in an otherwise empty tree, with nvidia-smi, the build (``python -m pip``, the
    ``python -c`` checks) and every check (``timeout``) stubbed; the cuVS probe runs for real in this Python.
    The memcheck step fails with status 3, the large-index step runs past its deadline (status 124)."""
    repo, stub = tmp_path / "repo", tmp_path / "stub"
    (repo / "bench" / "results").mkdir(parents=True)
    stub.mkdir()
    shutil.copy(GPU_CHECK, repo / "bench" / "gpu_check.sh")
    (repo / "bench" / "results" / "probe.json").write_text("{}\n")
    scripts = {
        "nvidia-smi": "#!/bin/sh\necho 9.0\n",
        "timeout": '#!/bin/sh\nshift\ncase "$*" in *memcheck*) exit 3 ;; *" large"*) exit 124 ;; esac\nexit 0\n',
        "py": f'#!/bin/sh\ncase "$1" in -m|-c) exit 0 ;; esac\nexec "{sys.executable}" "$@"\n',
    }
    for name, text in scripts.items():
        (stub / name).write_text(text)
        (stub / name).chmod(0o755)
    env = os.environ | {"PATH": f"{stub}:{os.environ['PATH']}", "PYTHON": str(stub / "py"), "OUT": str(tmp_path)}
    return repo, env


def test_gpu_check_without_cuvs_says_not_run_and_fails_unless_told(tmp_path):
    from dihal_fast.geometry.backends import get_backend

    try:
        get_backend("cuvs")
        pytest.skip("cuVS is usable here: the NOT RUN path is not taken")
    except df.BackendUnavailable:
        pass
    repo, env = _stubbed_gpu_check(tmp_path)
    run = _bash("bench/gpu_check.sh", cwd=repo, env=env)
    summary = run.stdout.split("== summary", 1)[1]
    assert "ok: torch sees a CUDA device" in summary and "ok: build (DIHAL_CUDA=ON, sm_90)" in summary
    assert "ok: kernel smoke with the certified-share check" in summary and "ok: -m gpu tests" in summary
    assert "FAILED (exit 3): side streams (kNN, covariance, local eigen) under compute-sanitizer memcheck" in summary
    assert "FAILED (deadline of 60 s): large-index smoke" in summary
    assert "ok: device guard" in summary and "racecheck" not in run.stdout
    assert "NOT RUN: cuvs (" in summary and "pass --no-cuvs" in summary
    assert "the cuVS probe failed" not in summary  # the reason is the probe's, from build_info / get_backend
    assert run.returncode == 1
    # Accepting a run without cuVS leaves the failing check failing ...
    assert _bash("bench/gpu_check.sh", "--no-cuvs", cwd=repo, env=env).returncode == 1
    # ... and exits 0 once every check passed; the NOT RUN line stays.
    (Path(env["PATH"].split(":")[0]) / "timeout").write_text("#!/bin/sh\nexit 0\n")
    accepted = _bash("bench/gpu_check.sh", "--no-cuvs", cwd=repo, env=env)
    assert accepted.returncode == 0, accepted.stdout[-2000:]
    assert "NOT RUN: cuvs (" in accepted.stdout and "pass --no-cuvs" not in accepted.stdout


def test_gpu_check_steps_fit_the_budget_in_priority_order(tmp_path):
    """Each step's deadline is cut to the budget left; steps that no longer fit are NOT RUN and fail the check, and
    the order is the stated priority (smoke, adversarial, memcheck, large, -m gpu)."""
    repo, env = _stubbed_gpu_check(tmp_path)
    stub = Path(env["PATH"].split(":")[0])
    # every check takes 3 s and records the deadline it was given
    (stub / "timeout").write_text(f'#!/bin/sh\necho "$1" >> {tmp_path}/deadlines\nsleep 3\nexit 0\n')
    run = _bash("bench/gpu_check.sh", "--no-cuvs", cwd=repo, env=env | {"GPU_CHECK_BUDGET": "22"})
    summary = run.stdout.split("== summary", 1)[1]
    assert run.returncode == 1
    assert "NOT RUN: large-index smoke (bfloat16, n * D > 2^31) (the 22 s budget is spent)" in summary
    assert "NOT RUN: -m gpu tests (the 22 s budget is spent)" in summary
    deadlines = [int(line.split()[0]) for line in (tmp_path / "deadlines").read_text().splitlines()]
    assert deadlines[0] <= 22 and all(later <= 22 - 3 for later in deadlines[1:])  # cut to what was left
    total = int(summary.split("total seconds: ", 1)[1].split()[0])
    assert total <= 22 + 3
    order = [line.split(": ", 1)[1].split(" (")[0] for line in summary.strip().splitlines() if ": " in line][:7]
    assert order[:3] == ["torch sees a CUDA device", "build", "kernel smoke with the certified-share check"]


def test_gpu_check_stops_when_torch_sees_no_gpu(tmp_path):
    repo, env = _stubbed_gpu_check(tmp_path)
    stub = Path(env["PATH"].split(":")[0])
    (stub / "timeout").write_text('#!/bin/sh\nshift\ncase "$*" in *is_available*) exit 1 ;; esac\nexit 0\n')
    run = _bash("bench/gpu_check.sh", "--no-cuvs", cwd=repo, env=env)
    assert run.returncode == 1
    assert "FAILED (exit 1): torch sees a CUDA device" in run.stdout
    assert "nothing else can be checked" in run.stdout and "== build" not in run.stdout


def test_first_run_smoke_rows_are_certified_by_the_emulated_kernel():
    """The smoke's ordinary rows, in every input dtype, are certified by the host emulation of the kNN kernel at
    far more than the 99 % the smoke demands (so a failing smoke means the device kernel, not the data)."""
    import torch

    from dihal_fast import _native

    core = _native.core()
    if not hasattr(core, "emulate_cuda_knn"):
        pytest.skip("this build's CPU module has no host emulation of the CUDA kNN")
    X = _first_run().ordinary_rows(1500, 64)
    for dtype in ("float32", "float16", "bfloat16", "float64"):
        if dtype == "bfloat16":
            rows = torch.from_numpy(X).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            out = core.emulate_cuda_knn(rows, 8, bfloat16=True)
        else:
            out = core.emulate_cuda_knn(np.ascontiguousarray(X.astype(dtype)), 8)
        assert np.mean(out["flags"] == 0) >= 0.999, dtype


def _first_run():
    """tools/gpu_first_run.py as a module (it imports torch and dihal_fast, never touches a GPU at import)."""
    spec = importlib.util.spec_from_file_location("gpu_first_run", FIRST_RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_first_run_checks_exist_and_refuse_without_a_device():
    first_run = _first_run()
    assert callable(first_run.streams) and callable(first_run.large) and callable(first_run.guard)
    assert callable(first_run.smoke)
    assert {dtype for _, dtype in first_run.COVARIANCE_ROWS} == {"float16", "float32", "float64"}
    assert max(first_run.LOCAL_EIGEN_K) + 1 == 64  # the block kernel's largest neighbourhood (MAX_LOCAL_POINTS)
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is usable here: bench/gpu_check.sh runs the checks")
    run = subprocess.run([sys.executable, str(FIRST_RUN), "guard"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and '"reason": "no CUDA device"' in run.stdout, run.stderr[-2000:]


def test_first_run_threads_raise_what_a_job_raised():
    first_run = _first_run()
    seen = []
    with pytest.raises(ValueError, match="job 2"):
        first_run.run_threads(lambda: seen.append(1), lambda: (_ for _ in ()).throw(ValueError("job 2")))
    assert seen == [1]


def _model_block_scale(max_abs: float) -> float:
    """The block-scale rule as csrc/covariance_scale.hpp states it: 2^-(ilogb(m) - 14) from m = 2^15 on, else 1."""
    return 2.0 ** -(math.frexp(max_abs)[1] - 1 - 14) if max_abs >= 32768.0 else 1.0


def _bound_block_scale():
    from dihal_fast import _native

    core = _native.core()
    if not hasattr(core, "covariance_block_scale"):
        pytest.skip("the installed _core predates covariance_block_scale (csrc/covariance_scale.hpp): rebuild it")
    return core.covariance_block_scale


@given(st.floats(min_value=0.0, max_value=1e300, allow_nan=False, allow_infinity=False))
def test_covariance_block_scale_is_the_stated_rule(max_abs):
    # The rule the CUDA covariance applies to float16/bfloat16/float32 blocks, bound from the header the device
    # code includes: an exact power of two that brings the largest centred value into [2^14, 2^15) once it is
    # 2^15 or more (float16 then stays finite), and leaves smaller blocks as they are.
    scale = _bound_block_scale()(max_abs)
    assert scale == _model_block_scale(max_abs)
    assert math.frexp(scale)[0] == 0.5  # a power of two: scaling and the merge's 1 / scale^2 are exact
    if max_abs >= 32768.0:
        assert 16384.0 <= max_abs * scale < 32768.0
        assert np.isfinite(np.float16(max_abs * scale)) and np.isfinite(np.float16(-max_abs * scale))
    else:
        assert scale == 1.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_covariance_block_scale_refuses_what_no_block_has(bad):
    with pytest.raises(ValueError, match="max_abs must be a finite number >= 0"):
        _bound_block_scale()(bad)


def _device_covariance(Y: np.ndarray, block: int = 1500) -> tuple[np.ndarray, np.ndarray]:
    """Host model of csrc/cuda/covariance.cu for float16 / bfloat16 / float32 rows (``Y`` as float64 values of the
    stored rows) fed ``block`` rows per update: float64 block mean, the power-of-two scale past 2^15, centred values
    rounded once to float32, float32 products, float64 merge (Chan) with the scale undone."""
    D = Y.shape[1]
    count, mean, M = 0, np.zeros(D), np.zeros((D, D))
    for r0 in range(0, len(Y), block):
        Xb = Y[r0 : r0 + block].astype(np.float64)
        block_mean = Xb.mean(axis=0)
        max_abs = np.abs(Xb - block_mean).max()
        scale = _model_block_scale(max_abs)
        with np.errstate(over="raise"):
            centred = ((Xb - block_mean) * scale).astype(np.float32)
        gram = (centred.T @ centred).astype(np.float64) / scale**2
        delta = block_mean - mean
        total = count + len(Xb)
        M += gram + np.outer(delta, delta) * (count * len(Xb) / total)
        mean += delta * (len(Xb) / total)
        count = total
    return mean, M / count


@pytest.mark.parametrize("name", ["float32", "float16", "float16 wide"])
def test_first_run_covariance_tolerances_hold_for_the_device_arithmetic(name):
    first_run = _first_run()
    Y = first_run.covariance_rows(name, 4396)
    dtype = dict(first_run.COVARIANCE_ROWS)[name]
    assert Y.dtype == np.dtype(dtype) and np.isfinite(Y).all()
    mean, sigma = _device_covariance(Y)
    error = first_run.covariance_error(Y, mean, sigma)
    tolerance = first_run.COVARIANCE_TOLERANCE[dtype]
    assert error <= tolerance / 10  # the device's arithmetic passes with a margin ...
    assert first_run.covariance_error(Y, mean, sigma * (1 + 10 * tolerance)) > tolerance  # ... a wrong one fails
    if name == "float16 wide":
        # every block's centred values pass 2^15 and would overflow float16 unscaled: the check runs the scale
        for r0 in range(0, len(Y), 1500):
            Xb = Y[r0 : r0 + 1500].astype(np.float64)
            centred = Xb - Xb.mean(axis=0)
            assert np.abs(centred).max() >= 32768.0
            with np.errstate(over="ignore"):
                assert not np.isfinite(centred.astype(np.float16)).all()


def bfloat16_rows(n: int, dim: int = 16, seed: int = 4):
    """bfloat16 rows with a large common offset (as hidden states), as a torch tensor, and their float64 values."""
    import torch

    rng = np.random.default_rng(seed)
    Y = torch.from_numpy(rng.standard_normal((n, dim)) * 3.0 + 40.0 * rng.standard_normal(dim)).to(torch.bfloat16)
    return Y, Y.double().numpy()


def test_bfloat16_covariance_model_meets_the_tolerance_and_rounding_to_bfloat16_would_not():
    """The GPU's 16-bit covariance arithmetic (centred values in float32) against the float64 covariance of the rows
    as stored, at the documented tolerance; centring in bfloat16 itself (8 bits) would miss it by far."""
    first_run = _first_run()
    _, Y = bfloat16_rows(4396)
    tolerance = first_run.COVARIANCE_TOLERANCE["bfloat16"]
    mean, sigma = _device_covariance(Y)
    assert first_run.covariance_error(Y, mean, sigma) <= tolerance / 10
    import torch

    def centred_in_bfloat16(block: np.ndarray) -> np.ndarray:
        return torch.from_numpy(block - block.mean(axis=0)).to(torch.bfloat16).double().numpy()

    M = sum(c.T @ c for c in (centred_in_bfloat16(Y[r0 : r0 + 1500]) for r0 in range(0, len(Y), 1500)))
    assert first_run.covariance_error(Y, Y.mean(axis=0), M / len(Y)) > 10 * tolerance


@pytest.mark.gpu
def test_gpu_bfloat16_covariance_meets_the_documented_tolerance():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    first_run = _first_run()
    Yt, Y = bfloat16_rows(20000, dim=96)
    cov = df.StreamingCovariance(Y.shape[1], backend="cuda")
    for block in Yt.cuda().split(3000):
        cov.update(block)
    assert first_run.covariance_error(Y, cov.mean, cov.covariance) <= first_run.COVARIANCE_TOLERANCE["bfloat16"]


def test_first_run_local_eigen_tolerance_holds_for_the_jacobi_routine():
    # The kernel's eigen step is csrc/jacobi.hpp's team routine (a serial team here) on each neighbourhood's
    # centred float64 Gram matrix: it meets the check's 1e-9 against the reference for both neighbourhood sizes.
    from dihal_fast import _native
    from dihal_fast import reference as ref

    first_run = _first_run()
    Z = first_run.local_eigen_rows(512, 50)[:64]
    for k in first_run.LOCAL_EIGEN_K:
        idx = ref.knn(Z, k)[0]
        lam_ref = ref.local_top_eigenvalues(Z, idx)
        lam = []
        for r in range(len(Z)):
            N = Z[np.concatenate(([r], idx[r]))].astype(np.float64)
            N -= N.mean(axis=0)
            lam.append(_native.core().jacobi_top_eigenvalue(N @ N.T) / len(N))
        assert np.abs(np.array(lam) - lam_ref).max() / lam_ref.max() <= 1e-9
