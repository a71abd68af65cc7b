"""The GPU-run scripts on a machine without a GPU: bench/gpu_check.sh's options, summary and exit status (its
build and checks stubbed), so that a first GPU run cannot pass silently without cuVS."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import dihal_fast as df

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = ROOT / "bench" / "gpu_check.sh"


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
    The racecheck step fails with status 3."""
    repo, stub = tmp_path / "repo", tmp_path / "stub"
    (repo / "bench" / "results").mkdir(parents=True)
    stub.mkdir()
    shutil.copy(GPU_CHECK, repo / "bench" / "gpu_check.sh")
    (repo / "bench" / "results" / "probe.json").write_text("{}\n")
    scripts = {
        "nvidia-smi": "#!/bin/sh\necho 9.0\n",
        "timeout": '#!/bin/sh\nshift\ncase "$*" in *racecheck*) exit 3 ;; esac\nexit 0\n',
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
    assert "ok: large-index smoke" in summary and "ok: CUDA tests" in summary
    assert "FAILED (3): two side streams under compute-sanitizer racecheck" in summary
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
