"""Shared fixtures: the real data in ../shared/data (skipped with a reason when absent), tiny checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis: a bounded default profile so the suite stays fast on 2 cores; "ci" is the same.
settings.register_profile("default", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("DIHAL_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (English text, Sudoku, Countdown); the test is skipped when it is absent."""
    if not (SHARED_DATA / "README.md").is_file():
        pytest.skip(f"shared data set not found at {SHARED_DATA} (only CI and developer machines have it)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Tiny random Llama / Qwen3 / GPT-2 / Mistral checkpoints with tokenizers, built once per session."""
    from dihal_fast.testing import FAMILIES, make_tiny_checkpoint

    root = tmp_path_factory.mktemp("tiny_models")
    return {family: make_tiny_checkpoint(root / family, family) for family in FAMILIES}
