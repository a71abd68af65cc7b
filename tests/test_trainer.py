"""The shared training loop on its own: a toy job trains, resumes bit for bit, honours a time budget and
``stop_at``, refuses a changed config, and the one LR schedule has the documented shape."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from dihal_fast.train import LoopSettings, TrainingJob, fit, lr_factor
from dihal_fast.train.checkpoint import latest_checkpoint
from dihal_fast.train.trainer import resume_point


class Regression(nn.Module):
    """Mean squared error of a linear map: the smallest objective the loop can train."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        loss = (self.linear(x).squeeze(-1) - y).pow(2).mean()
        return {"loss": loss, "scale": float(x.abs().mean())}


class RegressionJob(TrainingJob):
    """Batches drawn from a seeded generator (a stream the checkpoint must carry)."""

    name = "regression"

    def __init__(self, steps: int, lr: float = 0.3, **settings):
        torch.manual_seed(0)
        self.objective = Regression()
        self.settings = LoopSettings(steps=steps, batch_size=8, lr=lr, warmup_steps=2, ema_decay=0.9, log_every=1,
                                     checkpoint_every=3, **settings)
        self.configs = {"config.json": {"lr": lr}}
        self.resumable = frozenset()
        self.generator = torch.Generator().manual_seed(1)
        self.true = torch.tensor([1.0, -2.0, 0.5, 3.0])

    def batch(self, step: int, engine) -> dict:
        x = torch.randn(8, 4, generator=self.generator)
        return {"x": x, "y": x @ self.true}

    def stream_state(self):
        return {}, {"generator": self.generator.get_state()}

    def load_stream_state(self, plain, tensors):
        self.generator.set_state(tensors["generator"])


def _train(run_dir, steps: int, stop_at: int | None = None, lr: float = 0.3):
    job = RegressionJob(steps, lr)
    checkpoint = resume_point(run_dir, job.configs, job.resumable, steps, None, 1, resume=None)
    return fit(job, run_dir, checkpoint=checkpoint, stop_at=stop_at, progress=False)


def test_toy_job_learns_and_logs_every_step(tmp_path):
    run = _train(tmp_path, 40)
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 41))
    assert records[-1]["loss"] < 0.1 * records[0]["loss"]
    assert {"lr", "grad_norm", "elapsed_s", "scale"} <= set(records[0])
    assert latest_checkpoint(tmp_path).name == "step_00000040" and run.step == 40


def test_interrupted_and_resumed_run_equals_a_straight_one(tmp_path):
    _train(tmp_path / "straight", 8)
    _train(tmp_path / "resumed", 8, stop_at=4)  # checkpoints at 3 and 4 (the stop)
    _train(tmp_path / "resumed", 8)
    for name in ("weights.safetensors", "ema.safetensors"):
        a, b = (load_file(latest_checkpoint(tmp_path / d) / name) for d in ("straight", "resumed"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(line)["step"] for line in (tmp_path / "resumed" / "log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))


def test_a_changed_config_is_refused_before_training(tmp_path):
    _train(tmp_path, 3)
    with pytest.raises(ValueError, match=r"different settings for \['lr'\]"):
        _train(tmp_path, 6, lr=0.1)
    with pytest.raises(ValueError, match="already holds a training run"):
        job = RegressionJob(6)
        resume_point(tmp_path, job.configs, job.resumable, 6, None, 1, resume=False)


def test_time_budget_stops_with_a_checkpoint(tmp_path):
    job = RegressionJob(10**6, max_minutes=0.02 / 60, budget_clock="wall")
    run = fit(job, tmp_path, progress=False)
    assert 0 < run.step < 10**6
    assert latest_checkpoint(tmp_path).name == f"step_{run.step:08d}"


def test_non_finite_loss_stops_the_run(tmp_path):
    job = RegressionJob(5)
    job.true = torch.tensor([float("nan")] * 4)
    with pytest.raises(FloatingPointError, match="non-finite loss"):
        fit(job, tmp_path, progress=False)


def test_one_schedule_warmup_then_cosine_or_constant():
    cosine = LoopSettings(steps=110, batch_size=1, lr=1.0, warmup_steps=10, lr_floor=0.1)
    assert [lr_factor(s, cosine) for s in (0, 9)] == pytest.approx([0.1, 1.0])
    assert lr_factor(60, cosine) == pytest.approx(0.55) and lr_factor(110, cosine) == pytest.approx(0.1)
    constant = LoopSettings(steps=110, batch_size=1, lr=1.0, warmup_steps=4, lr_floor=1.0)
    assert [lr_factor(s, constant) for s in (0, 3, 4, 109)] == [0.25, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="lr_floor"):
        LoopSettings(steps=1, batch_size=1, lr=1.0, warmup_steps=0, lr_floor=1.5)
