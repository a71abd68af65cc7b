"""The shared training loop on its own: a toy job trains, resumes bit for bit, honours a time budget and
``stop_at``, refuses a changed config, and the one LR schedule has the documented shape."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from dihal_fast.common.serial import SerialConfig
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
        self.settings = LoopSettings(
            steps=steps, batch_size=8, lr=lr, warmup_steps=2, ema_decay=0.9, log_every=1, checkpoint_every=3, **settings
        )
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


class StreamJob(RegressionJob):
    """Micro-batch ``i`` holds rows ``i*B .. i*B+B-1`` of one fixed stream (the convention of TrainingJob.batch)."""

    def __init__(self, steps: int, batch_size: int, grad_accum_steps: int, **settings):
        super().__init__(steps, **settings)
        self.settings = LoopSettings(
            steps=steps,
            batch_size=batch_size,
            lr=0.3,
            warmup_steps=2,
            ema_decay=0.9,
            log_every=1,
            checkpoint_every=3,
            grad_accum_steps=grad_accum_steps,
            **settings,
        )
        self.configs = {"config.json": {"lr": 0.3, "grad_accum_steps": grad_accum_steps}}
        self.stream = torch.randn(steps * batch_size * grad_accum_steps, 4, generator=torch.Generator().manual_seed(2))

    def batch(self, step: int, engine) -> dict:
        b = self.settings.batch_size
        x = self.stream[step * b : (step + 1) * b].to(engine.device)
        return {"x": x, "y": x @ self.true}


def _weights(run_dir):
    return load_file(latest_checkpoint(run_dir) / "weights.safetensors")


def _log(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("batch_size, accum", [(4, 2), (2, 4), (1, 8)])
def test_gradient_accumulation_equals_the_large_batch(tmp_path, batch_size, accum):
    fit(StreamJob(6, 8, 1), tmp_path / "big", progress=False)
    fit(StreamJob(6, batch_size, accum), tmp_path / "accum", progress=False)
    big, small = _weights(tmp_path / "big"), _weights(tmp_path / "accum")
    assert big.keys() == small.keys()
    for name in big:
        torch.testing.assert_close(small[name], big[name], rtol=1e-5, atol=1e-6)
    for a, b in zip(_log(tmp_path / "big"), _log(tmp_path / "accum"), strict=True):
        assert a["step"] == b["step"] and a["lr"] == b["lr"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5) and b["grad_norm"] == pytest.approx(
            a["grad_norm"], rel=1e-4
        )


def test_accumulated_run_resumes_bit_for_bit_and_refuses_another_accumulation(tmp_path):
    fit(StreamJob(6, 4, 2), tmp_path / "straight", progress=False)
    job = StreamJob(6, 4, 2)
    fit(job, tmp_path / "resumed", stop_at=4, progress=False)
    checkpoint = resume_point(tmp_path / "resumed", job.configs, job.resumable, 6, None, 1, resume=True)
    fit(StreamJob(6, 4, 2), tmp_path / "resumed", checkpoint=checkpoint, progress=False)
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = StreamJob(6, 2, 4)
    with pytest.raises(ValueError, match="grad_accum_steps"):
        resume_point(tmp_path / "resumed", other.configs, other.resumable, 6, None, 1, resume=True)


@dataclass
class _LaterSettings(SerialConfig):
    """A config that gained ``grad_accum_steps`` after runs were saved without it (declared in ``legacy``)."""

    legacy = {"grad_accum_steps": 1}
    lr: float = 0.3
    grad_accum_steps: int = 1


def test_a_run_saved_before_gradient_accumulation_existed_resumes(tmp_path):
    old = RegressionJob(6)  # its config has no grad_accum_steps
    fit(old, tmp_path, stop_at=3, progress=False)
    new = RegressionJob(6)
    configs = {"config.json": _LaterSettings()}
    assert resume_point(tmp_path, configs, new.resumable, 6, None, 1, resume=True).name == "step_00000003"
    with pytest.raises(ValueError, match="grad_accum_steps"):
        resume_point(tmp_path, {"config.json": _LaterSettings(grad_accum_steps=2)}, new.resumable, 6, None, 1, True)
    with pytest.raises(ValueError, match="grad_accum_steps"):  # a plain dict is compared whole
        resume_point(tmp_path, {"config.json": {"lr": 0.3, "grad_accum_steps": 1}}, new.resumable, 6, None, 1, True)


def test_deepspeed_accumulation_equals_the_large_plain_torch_batch(tmp_path):
    pytest.importorskip("deepspeed")
    from dihal_fast.train.trainer import prepare_deepspeed, training_session

    fit(StreamJob(4, 8, 1), tmp_path / "torch", progress=False)
    job = StreamJob(4, 4, 2)
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 2}))
    ds_config, _ = prepare_deepspeed(tmp_path / "ds.json", job.settings)
    assert (ds_config["train_batch_size"], ds_config["gradient_accumulation_steps"]) == (8, 2)
    with training_session(ds_config, job.settings):
        fit(job, tmp_path / "ds", ds_config, progress=False)
    plain, ds = _weights(tmp_path / "torch"), _weights(tmp_path / "ds")
    for name in plain:
        torch.testing.assert_close(ds[name], plain[name], rtol=1e-5, atol=1e-6)
    assert [r["lr"] for r in _log(tmp_path / "ds")] == pytest.approx([r["lr"] for r in _log(tmp_path / "torch")])


def test_deepspeed_config_contradicting_the_accumulation_is_refused(tmp_path):
    from dihal_fast.train.deepspeed_engine import check_deepspeed_config

    settings = LoopSettings(steps=1, batch_size=4, lr=1.0, warmup_steps=0, grad_accum_steps=2)
    filled = check_deepspeed_config({"train_batch_size": 8}, settings, cuda=False)
    assert (filled["gradient_accumulation_steps"], filled["train_micro_batch_size_per_gpu"]) == (2, 4)
    with pytest.raises(ValueError, match="gradient_accumulation_steps = 4 contradicts.*--grad-accum-steps 2"):
        check_deepspeed_config({"gradient_accumulation_steps": 4}, settings, cuda=False)
    with pytest.raises(ValueError, match="grad_accum_steps must be >= 1"):
        LoopSettings(steps=1, batch_size=4, lr=1.0, warmup_steps=0, grad_accum_steps=0)


def test_loop_settings_take_the_family_fields_by_name_and_the_given_ones():
    from dihal_fast.backbone.config import BackboneTrainConfig
    from dihal_fast.hcdlm.config import HCDLMTrainConfig
    from dihal_fast.replace.config import BridgeTrainConfig

    bridge = BridgeTrainConfig(steps=7, lr=0.02, grad_accum_steps=3, keep_checkpoints=4, seed=5)
    settings = bridge.loop_settings("cpu")
    assert (settings.steps, settings.lr, settings.grad_accum_steps, settings.keep_checkpoints, settings.seed) == (
        7,
        0.02,
        3,
        4,
        5,
    )
    assert settings.lr_floor == 0.1 and settings.device == "cpu"
    backbone = BackboneTrainConfig(corpus=["x.txt"], min_lr_ratio=0.3, checkpoint_every=9).loop_settings()
    assert (backbone.lr_floor, backbone.betas, backbone.decay_matrices_only, backbone.keep_checkpoints) == (
        0.3,
        (0.9, 0.95),
        True,
        1,
    )
    assert backbone.checkpoint_every == 9
    from dihal_fast.hcdlm.trainer import loop_settings

    hcdlm = loop_settings(HCDLMTrainConfig(max_minutes=2.5, budget_clock="cpu"), "cpu")
    assert (hcdlm.lr_floor, hcdlm.max_minutes, hcdlm.budget_clock) == (1.0, 2.5, "cpu")
