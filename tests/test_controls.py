"""The Diffusion-LM control: trained through the shared loop (schedule, EMA, checkpoints, exact resume)."""

from __future__ import annotations

import json

import pytest
import torch

from dihal_fast.controls import DiffusionLM, DiffusionLMConfig, train_diffusion_lm
from dihal_fast.controls.diffusion_lm import DiffusionLMJob
from dihal_fast.train.checkpoint import latest_checkpoint
from dihal_fast.train.settings import lr_factor
from dihal_fast.train.trainer import fit

VOCAB, DIM, SEQ = 37, 12, 8


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(VOCAB, DIM, generator=generator), torch.randint(0, VOCAB, (50, SEQ), generator=generator)


def _config(**changes) -> DiffusionLMConfig:
    return DiffusionLMConfig(
        **{
            "seq_len": SEQ,
            "width": 16,
            "layers": 1,
            "heads": 2,
            "batch_size": 4,
            "steps": 12,
            "warmup_steps": 3,
            "nfe": 4,
            "checkpoint_every": 4,
            **changes,
        }
    )


def test_training_uses_the_shared_schedule_log_and_exports_ema_weights(tmp_path):
    embedding, blocks = _data()
    config = _config()
    model = train_diffusion_lm(embedding, blocks, config, tmp_path, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    settings = config.loop_settings()
    logged = {row["step"]: row["lr"] for row in rows if "lr" in row}
    assert logged, rows
    for step, lr in logged.items():  # the rate after step s's update is that of step s (0-based)
        assert lr == pytest.approx(config.lr * lr_factor(step, settings), rel=1e-6)
    assert latest_checkpoint(tmp_path) is not None
    # the exported weights are the EMA's, not the last step's
    last = latest_checkpoint(tmp_path)
    from safetensors.torch import load_file

    exported = load_file(tmp_path / "model.safetensors")
    ema, raw = load_file(last / "ema.safetensors"), load_file(last / "weights.safetensors")
    assert ema.keys() == raw.keys() and len(ema) > 4
    for name, value in ema.items():
        assert torch.equal(exported[name.removeprefix("model.")], value)
    assert any(not torch.equal(ema[name], raw[name]) for name in ema)
    again = train_diffusion_lm(embedding, blocks, config, tmp_path, progress=False)  # loaded, not retrained
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    tokens = again.sample(3, SEQ, config.nfe, torch.Generator().manual_seed(1))
    assert tokens.shape == (3, SEQ) and tokens.dtype == torch.int64 and int(tokens.max()) < VOCAB


def test_diffusion_lm_rounding_and_memorisation(tmp_path):
    torch.manual_seed(0)
    embedding = torch.randn(40, 16)
    block = torch.arange(3, 15)[None]  # one 12-token sequence, repeated: the control must learn to emit it
    config = DiffusionLMConfig(seq_len=12, width=32, steps=150, batch_size=4)
    control = train_diffusion_lm(embedding, block.expand(8, -1), config, tmp_path / "dlm", progress=False)
    x = torch.randn(2, 12, 16)
    want = -((x[:, :, None, :] - control.table[None, None]) ** 2).sum(-1)
    assert torch.allclose(control.round_logits(x), want, atol=1e-3)
    sample = control.sample(3, 12, nfe=10, generator=torch.Generator().manual_seed(0))
    assert sample.shape == (3, 12)
    assert (sample == block).float().mean() > 0.9
    with pytest.raises(ValueError, match="length"):
        control.sample(1, 13, nfe=2)


def _weights(job: DiffusionLMJob) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in job.objective.named_parameters()}


def test_interrupted_run_resumes_to_the_same_weights(tmp_path):
    embedding, blocks = _data(1)
    config = _config(steps=8)
    torch.manual_seed(config.seed)
    whole = DiffusionLMJob(DiffusionLM(embedding, config), blocks, config, "cpu")
    fit(whole, tmp_path / "whole", progress=False)
    torch.manual_seed(config.seed)
    first = DiffusionLMJob(DiffusionLM(embedding, config), blocks, config, "cpu")
    fit(first, tmp_path / "cut", stop_at=4, progress=False)
    torch.manual_seed(123)  # the resumed process starts from other initial weights: the checkpoint decides
    second = DiffusionLMJob(DiffusionLM(embedding, config), blocks, config, "cpu")
    fit(second, tmp_path / "cut", checkpoint=latest_checkpoint(tmp_path / "cut"), progress=False)
    expected, got = _weights(whole), _weights(second)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name


def test_a_changed_config_is_refused_on_resume_and_a_longer_budget_continues(tmp_path):
    embedding, blocks = _data(2)
    train_diffusion_lm(embedding, blocks, _config(steps=4), tmp_path, progress=False)
    with pytest.raises(ValueError, match="width"):
        train_diffusion_lm(embedding, blocks, _config(steps=4, width=32), tmp_path, progress=False)
    train_diffusion_lm(embedding, blocks, _config(steps=6), tmp_path, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert max(row["step"] for row in rows if "step" in row) == 6


@pytest.mark.parametrize(
    "changes, match",
    [({"width": 15}, "even"), ({"heads": 3}, "multiple"), ({"lr": float("nan")}, "--lr"), ({"steps": 0}, "--steps")],
)
def test_bad_configs_are_refused_in_one_line(changes, match):
    with pytest.raises(ValueError, match=match):
        _config(**changes)
    embedding, blocks = _data()
    with pytest.raises(ValueError, match=r"blocks must be \[N, 8\]"):
        train_diffusion_lm(embedding, blocks[:, :5], _config(), "unused")
