"""The CPU thread governor: free cores from the other processes' load, pinning, rate limit."""

from __future__ import annotations

import pytest
import torch

from dihal_fast import cpu_threads
from dihal_fast.cpu_threads import CpuSample, ThreadGovernor, choose_threads, other_busy_cores, pinned_threads


@pytest.mark.parametrize(
    ("cores", "other", "expected"),
    [
        (2, 0.0, 2),
        (2, 0.2, 2),
        (2, 0.45, 2),
        (2, 0.6, 1),
        (2, 1.0, 1),
        (2, 3.5, 1),
        (4, 1.0, 3),
        (4, 1.6, 2),
        (1, 0.0, 1),
    ],
)
def test_choose_threads_leaves_the_busy_cores(cores, other, expected):
    assert choose_threads(cores, other) == expected


def test_other_busy_cores_subtracts_own_time():
    start, end = CpuSample(10.0, 1.0, 100.0), CpuSample(13.0, 2.0, 102.0)
    assert other_busy_cores(start, end) == pytest.approx(1.0)  # 3 busy core-seconds, 1 our own, over 2 s
    assert other_busy_cores(end, end) == 0.0


def test_pinned_threads(monkeypatch):
    monkeypatch.delenv(cpu_threads.ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert pinned_threads() is None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert pinned_threads() == 2
    monkeypatch.setenv(cpu_threads.ENV, "3")
    assert pinned_threads() == 3
    monkeypatch.setenv(cpu_threads.ENV, "auto")
    assert pinned_threads() == 2
    monkeypatch.setenv(cpu_threads.ENV, "zero")
    with pytest.raises(ValueError, match="DIHAL_NUM_THREADS"):
        pinned_threads()


@pytest.fixture
def fake_machine(monkeypatch):
    """A 2-core machine whose /proc/stat readings come from a list; applied counts are recorded."""
    monkeypatch.delenv(cpu_threads.ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 2)
    readings: list[CpuSample] = []
    applied: list[int] = []
    monkeypatch.setattr(cpu_threads, "cpu_sample", lambda: readings.pop(0))
    monkeypatch.setattr(cpu_threads, "apply_threads", applied.append)
    monkeypatch.setattr(ThreadGovernor, "_changed_elsewhere", lambda self: False)
    return readings, applied


def test_governor_follows_the_neighbour(fake_machine):
    readings, applied = fake_machine
    readings += [CpuSample(0.0, 0.0, 0.0), CpuSample(2.0, 1.0, 1.0)]  # one other core busy while loading
    governor = ThreadGovernor(interval=2.0)
    assert governor.poll() == 1 and applied == [1]
    readings.append(CpuSample(3.0, 2.0, 2.0))  # too soon: no new decision
    assert governor.poll() == 1 and readings == []
    readings.append(CpuSample(5.0, 4.0, 4.0))  # neighbour gone: only our own thread was busy
    assert governor.poll() == 2 and applied == [1, 2]


def test_governor_respects_a_pinned_count(fake_machine, monkeypatch):
    readings, applied = fake_machine
    monkeypatch.setenv(cpu_threads.ENV, "1")
    readings.append(CpuSample(0.0, 0.0, 0.0))
    governor = ThreadGovernor()
    assert applied == [1] and governor.poll() == 1 and applied == [1]


def test_an_explicit_torch_setting_wins(monkeypatch):
    monkeypatch.delenv(cpu_threads.ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        governor = ThreadGovernor(min_window=0.0)
        governor.poll()
        chosen = governor.threads
        torch.set_num_threads(3 if chosen != 3 else 2)  # what a --threads option does
        assert governor.poll() == torch.get_num_threads() != chosen
        assert governor.pinned == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_poll_without_a_governor_changes_nothing(monkeypatch):
    monkeypatch.setattr(cpu_threads, "_GOVERNOR", None)
    before = torch.get_num_threads()
    assert cpu_threads.poll_threads() is None and torch.get_num_threads() == before


def test_configure_openmp_bounds_the_spin_and_honours_a_pinned_count(monkeypatch):
    for name in (cpu_threads.ENV, "OMP_NUM_THREADS", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    cpu_threads.configure_openmp()
    assert cpu_threads.os.environ["GOMP_SPINCOUNT"] == str(cpu_threads.SPIN_COUNT)
    assert "OMP_NUM_THREADS" not in cpu_threads.os.environ
    monkeypatch.setenv("GOMP_SPINCOUNT", "123")
    monkeypatch.setenv(cpu_threads.ENV, "1")
    cpu_threads.configure_openmp()
    assert cpu_threads.os.environ["GOMP_SPINCOUNT"] == "123" and cpu_threads.os.environ["OMP_NUM_THREADS"] == "1"
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # a user's wait policy is left alone
    cpu_threads.configure_openmp()
    assert "GOMP_SPINCOUNT" not in cpu_threads.os.environ


def test_the_library_import_leaves_the_environment_alone_and_the_command_bounds_the_spin():
    import subprocess
    import sys

    code = (
        "import os; os.environ.pop('GOMP_SPINCOUNT', None); os.environ.pop('OMP_WAIT_POLICY', None); "
        "import dihal_fast; print(os.environ.get('GOMP_SPINCOUNT')); "
        "import dihal_fast.cli; print(os.environ.get('GOMP_SPINCOUNT'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["None", str(cpu_threads.SPIN_COUNT)]
