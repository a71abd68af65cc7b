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


def _short_locate_replace(model: str | os.PathLike, out: str | os.PathLike, max_tokens: int = 1024, steps: int = 3):
    """``locate`` on ``max_tokens`` tokens of the shipped corpus into ``out/locate``, then a ``steps``-step
    ``replace`` at the layer it selects into ``out/replace`` (a narrow bridge, blocks of 32 tokens), on ``model``
    (a checkpoint directory or a ``.gguf`` file): ``(LocateReport, ReplaceReport)``."""
    from dihal_fast.pipeline import LocateConfig, ReplaceConfig, locate, replace
    from dihal_fast.replace.config import BridgeTrainConfig

    out = Path(out)
    locate_config = LocateConfig(
        model=str(model), max_tokens=max_tokens, seq_len=32, repeats=2, sample_size=200, k=8, n_pairs=500
    )
    located = locate(locate_config, out / "locate")
    train = BridgeTrainConfig(
        seq_len=32,
        batch_size=2,
        val_blocks=2,
        stats_blocks=4,
        steps=steps,
        warmup_steps=1,
        checkpoint_every=steps,
        log_every=1,
        bridge={"width": 32, "heads": 2, "time_dim": 16},
    )
    replaced = replace(ReplaceConfig(model=str(model), from_locate=str(out / "locate"), train=train), out / "replace")
    return located, replaced


@pytest.fixture
def short_locate_replace():
    """``locate`` then a few-step ``replace`` on a checkpoint, at the smallest size that exercises every part."""
    return _short_locate_replace
