"""libgomp found, not assumed: the CPU core loads on a host without a system libgomp when torch (which
carries one) is installed, sharing torch's copy, and where neither exists the error names the missing
library and what provides it.

The real tests hide the system's libgomp in a private mount namespace (an overlay of the library folder
with the library whited out), so they need root and overlayfs; elsewhere they skip, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dihal_fast import _native

SYSTEM_LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
# The system tools (unshare, mknod, mount) by absolute search path: the wheel smoke runs with only its venv on PATH.
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def run_without_system_libgomp(tmp_path: Path, code: str) -> dict:
    """Run ``code`` (which prints one JSON line) in a mount namespace where the system's libgomp is hidden."""
    unshare, mknod = shutil.which("unshare", path=SYSTEM_PATH), shutil.which("mknod", path=SYSTEM_PATH)
    if unshare is None or mknod is None or not (SYSTEM_LIBDIR / "libgomp.so.1").exists():
        pytest.skip("needs unshare(1) and a system libgomp in /usr/lib/x86_64-linux-gnu to hide")
    upper, work = tmp_path / "upper", tmp_path / "work"
    upper.mkdir()
    work.mkdir()
    for name in (p.name for p in SYSTEM_LIBDIR.glob("libgomp.so*")):
        # an overlay whiteout: a 0/0 character device hides the lower file of that name
        result = subprocess.run([mknod, str(upper / name), "c", "0", "0"], capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot make overlay whiteouts (mknod: {result.stderr.strip()})")
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(code))
    mount = (
        f"mount -t overlay overlay -o lowerdir={SYSTEM_LIBDIR},upperdir={upper},workdir={work} {SYSTEM_LIBDIR}"
        f" && exec {sys.executable} {script}"
    )
    env = dict(os.environ, PATH=SYSTEM_PATH)
    result = subprocess.run([unshare, "-m", "sh", "-c", mount], capture_output=True, text=True, timeout=300, env=env)
    if result.returncode != 0 and "mount" in result.stderr and "python" not in result.stderr.lower():
        pytest.skip(f"no private overlay mount here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


PROBE_HEAD = """
import ctypes, json
from dihal_fast import _native
try:
    ctypes.CDLL("libgomp.so.1")  # by name: the loader's own search, with torch's copy not yet loaded
    hidden = False
except OSError:
    hidden = True
"""


def test_core_loads_on_torchs_libgomp_without_a_system_one(tmp_path: Path) -> None:
    torch_copy = _native.torch_libgomp()
    if torch_copy is None:
        pytest.skip("the installed torch carries no torch/lib/libgomp.so.1")
    out = run_without_system_libgomp(
        tmp_path,
        PROBE_HEAD
        + """
import numpy as np
core = _native.core()
x = np.random.default_rng(0).standard_normal((64, 5))
idx, _ = core.knn(x, 3)  # an OpenMP kernel runs on the runtime it bound to
from dihal_fast import reference
same = bool(np.array_equal(idx, reference.knn(x, 3)[0]))
print(json.dumps({"hidden": hidden, "libgomp": _native.loaded_libgomp(), "knn_ok": same}))
""",
    )
    assert out["hidden"], "the system libgomp was not hidden: the test proves nothing"
    assert out["libgomp"] == [str(Path(torch_copy).resolve())], "torch's copy must be the one OpenMP runtime"
    assert out["knn_ok"], "the kNN kernel on torch's OpenMP runtime differs from the reference"


def test_error_names_libgomp_and_its_providers_when_none_exists(tmp_path: Path) -> None:
    out = run_without_system_libgomp(
        tmp_path,
        PROBE_HEAD
        + """
_native.torch_libgomp = lambda: None  # as on a host without torch
try:
    _native.core()
    message = ""
except _native.BackendUnavailable as exc:
    message = str(exc)
print(json.dumps({"hidden": hidden, "message": message}))
""",
    )
    assert out["hidden"]
    message = out["message"]
    assert "libgomp.so.1 was not found" in message
    assert "pip install torch" in message and "libgomp1" in message
    assert "from source" not in message


def test_missing_library_reason_maps_known_libraries() -> None:
    gomp = ImportError("libgomp.so.1: cannot open shared object file: No such file or directory")
    assert "pip install torch" in _native.missing_library_reason(gomp)
    blas = ImportError("libscipy_openblas.so: cannot open shared object file: No such file or directory")
    assert "pip install scipy-openblas32" in _native.missing_library_reason(blas)
    assert _native.missing_library_reason(ImportError("undefined symbol: foo")) == ""


def test_uncompiled_core_keeps_the_source_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        _native, "_load", lambda name: (None, "ModuleNotFoundError: No module named 'dihal_fast._core'")
    )
    with pytest.raises(_native.BackendUnavailable, match="from source with a C\\+\\+17 compiler"):
        _native.core()
    monkeypatch.setattr(_native, "_load", lambda name: (None, "libgomp.so.1 was not found: it is ..."))
    with pytest.raises(_native.BackendUnavailable, match="Install what is missing") as info:
        _native.core()
    assert "from source" not in str(info.value)
