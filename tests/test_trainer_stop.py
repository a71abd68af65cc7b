"""No work lost to a stop: SIGTERM or Ctrl-C during training writes the checkpoint of the last step and names it,
checkpoints are also written by wall time, and a run stopped either way resumes bit for bit (the shared loop alone,
with the plain-torch and the DeepSpeed engine, and the bridge training of ``dihal replace``)."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from dihal_fast.train import LoopSettings, TrainingJob, fit
from dihal_fast.train.checkpoint import latest_checkpoint
from dihal_fast.train.trainer import resume_point


class Regression(nn.Module):
    """Mean squared error of a linear map."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        return {"loss": (self.linear(x)[:, 0] - y).pow(2).mean()}


class SignalledJob(TrainingJob):
    """A linear regression whose batch of step ``at`` (0-based) sends itself ``signals``; records its checkpoints."""

    name = "signalled"

    def __init__(self, steps: int, at: int = -1, signals: tuple[int, ...] = (), **settings):
        torch.manual_seed(0)
        self.objective = Regression()
        self.settings = LoopSettings(
            **{"steps": steps, "batch_size": 8, "lr": 0.1, "warmup_steps": 2, "ema_decay": 0.9, **settings}
        )
        self.configs = {"config.json": {"steps": steps}}
        self.resumable = frozenset({"steps"})
        self.generator = torch.Generator().manual_seed(1)
        self.at, self.signals, self.checkpoints = at, signals, []

    def batch(self, step: int, engine) -> dict:
        if step == self.at:
            for signum in self.signals:
                os.kill(os.getpid(), signum)
        x = torch.randn(8, 4, generator=self.generator)
        return {"x": x, "y": x @ torch.tensor([1.0, -2.0, 0.5, 3.0])}

    def stream_state(self):
        return {}, {"generator": self.generator.get_state()}

    def load_stream_state(self, plain, tensors):
        self.generator.set_state(tensors["generator"])

    def on_checkpoint(self, step, run) -> None:
        self.checkpoints.append(step)


def _fit(run_dir, job: SignalledJob, **kwargs):
    checkpoint = resume_point(run_dir, job.configs, job.resumable, job.settings.steps, None, 1, resume=None)
    return fit(job, run_dir, checkpoint=checkpoint, progress=False, **kwargs)


def _same_weights(a, b) -> None:
    for name in ("weights.safetensors", "ema.safetensors"):
        x, y = (load_file(latest_checkpoint(d) / name) for d in (a, b))
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), name


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_checkpoints_the_step_in_progress_and_the_run_resumes_bit_for_bit(tmp_path, signum):
    _fit(tmp_path / "straight", SignalledJob(50, checkpoint_every=20))
    stopped = SignalledJob(50, at=41, signals=(signum,), checkpoint_every=20)
    with pytest.raises(KeyboardInterrupt, match=r"after step 42; a rerun of .* continues from step 42 "):
        _fit(tmp_path / "run", stopped)
    assert stopped.checkpoints == [20, 40, 42]
    assert latest_checkpoint(tmp_path / "run").name == "step_00000042"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are given back
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    _fit(tmp_path / "run", SignalledJob(50, checkpoint_every=20))
    _same_weights(tmp_path / "straight", tmp_path / "run")
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert steps == list(range(10, 51, 10))


def test_a_second_ctrl_c_stops_at_once_naming_the_newest_checkpoint_or_none(tmp_path):
    twice = (signal.SIGINT, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt, match=r"holds no checkpoint and starts from step 0"):
        _fit(tmp_path / "none", SignalledJob(50, at=0, signals=twice))
    assert latest_checkpoint(tmp_path / "none") is None
    job = SignalledJob(50, at=41, signals=twice, checkpoint_every=20)
    with pytest.raises(KeyboardInterrupt, match=r"continues from step 40 \(checkpoints/step_00000040\)"):
        _fit(tmp_path / "run", job)
    assert job.checkpoints == [20, 40]


def test_repeated_sigterm_only_repeats_the_request(tmp_path):
    job = SignalledJob(50, at=6, signals=(signal.SIGTERM, signal.SIGTERM), checkpoint_every=20)
    with pytest.raises(KeyboardInterrupt, match="continues from step 7 "):
        _fit(tmp_path, job)
    assert job.checkpoints == [7]


def test_checkpoints_are_also_written_by_wall_time_and_resume_bit_for_bit(tmp_path):
    _fit(tmp_path / "straight", SignalledJob(12, checkpoint_every=100))
    job = SignalledJob(12, checkpoint_every=100, checkpoint_minutes=1e-9)  # due before every step
    _fit(tmp_path / "timed", job, stop_at=7)
    assert job.checkpoints == [1, 2, 3, 4, 5, 6, 7]
    _fit(tmp_path / "timed", SignalledJob(12, checkpoint_every=100))
    _same_weights(tmp_path / "straight", tmp_path / "timed")
    assert LoopSettings(steps=1, batch_size=1, lr=0.1, warmup_steps=0).checkpoint_minutes == 5.0
    with pytest.raises(ValueError, match="checkpoint_minutes must be >= 0"):
        LoopSettings(steps=1, batch_size=1, lr=0.1, warmup_steps=0, checkpoint_minutes=-1.0)


def test_deepspeed_checkpoints_the_step_in_progress_on_sigterm(tmp_path):
    pytest.importorskip("deepspeed")
    from dihal_fast.train.trainer import prepare_deepspeed, training_session

    job = SignalledJob(20, at=5, signals=(signal.SIGTERM,), checkpoint_every=100)
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    ds_config, _ = prepare_deepspeed(tmp_path / "ds.json", job.settings)
    with training_session(ds_config, job.settings), pytest.raises(KeyboardInterrupt, match="continues from step 6 "):
        fit(job, tmp_path / "run", ds_config, progress=False)
    state = json.loads((latest_checkpoint(tmp_path / "run") / "state.json").read_text())
    assert (state["step"], state["engine"]) == (6, "deepspeed")


BRIDGE = {
    "seq_len": 16,
    "batch_size": 4,
    "val_blocks": 4,
    "stats_blocks": 8,
    "steps": 6,
    "checkpoint_every": 4,
    "eval_every": 2,
    "warmup_steps": 2,
    "bridge": {"width": 32, "heads": 2, "context_layers": 1, "time_dim": 16},
}


def _bridge(model, corpus, out, callback=None) -> None:
    from dihal_fast.replace import BridgeTrainConfig, train_bridge

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_bridge(model, 1, corpus, out, BridgeTrainConfig(**BRIDGE), resume=True, callback=callback)
    finally:
        torch.set_num_threads(threads)


def test_replace_stopped_by_sigterm_checkpoints_its_step_and_resumes_to_the_straight_run(tiny_checkpoints, tmp_path):
    words = "the cat dog sat ran on a mat tree red blue small big and then it was happy".split()
    generator = torch.Generator().manual_seed(0)
    picks = torch.randint(0, len(words), (200, 8), generator=generator).tolist()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(words[i] for i in row) + "." for row in picks) + "\n")
    model = tiny_checkpoints["llama"]
    _bridge(model, corpus, tmp_path / "straight")

    def sigterm_at_step_3(info) -> None:
        if info.step == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(KeyboardInterrupt):
        _bridge(model, corpus, tmp_path / "run", sigterm_at_step_3)
    assert latest_checkpoint(tmp_path / "run").name == "step_00000003"
    _bridge(model, corpus, tmp_path / "run")
    for name in ("hybrid/model.safetensors", "log.jsonl", "validation.json"):
        straight, resumed = (_without_timing(tmp_path / d / name) for d in ("straight", "run"))
        assert straight == resumed, name


def _without_timing(path):
    """A run's file as bytes, or for JSON and JSONL its records without the timing fields."""
    timing = {"elapsed_s", "seconds", "train_seconds", "train_seconds_this_run", "tokens_per_s"}

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in timing}
        return [strip(v) for v in value] if isinstance(value, list) else value

    if path.suffix == ".json":
        return strip(json.loads(path.read_text()))
    if path.suffix == ".jsonl":
        return [strip(json.loads(line)) for line in path.read_text().splitlines()]
    return path.read_bytes()
