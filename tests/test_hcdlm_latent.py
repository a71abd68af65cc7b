"""The options that make the latent carry information: the latent's own noise schedule (``latent_schedule_power``),
a scaffold kept noisy at every step (``scaffold_floor``) and all-[MASK] scaffolds in training (``scaffold_blind``)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from dihal_fast.cli import main
from dihal_fast.hcdlm import mechanism, objective
from dihal_fast.hcdlm.config import HCDLMModelConfig, ObjectiveConfig, RunConfig, SampleConfig
from dihal_fast.hcdlm.networks import HCDLM
from dihal_fast.hcdlm.noise import LATENT_FLOW, UniformKernel, latent_level, latent_step, scaffold_level
from dihal_fast.hcdlm.objective import hcdlm_loss
from dihal_fast.hcdlm.sampler import sample_hcdlm
from dihal_fast.hcdlm.scoring import load_run
from dihal_fast.hcdlm.trainer import train
from dihal_fast.tasks.sudoku_task import SudokuTask, generate_pool
from dihal_fast.testing.tiny import HCDLM_TINY, HCDLM_TINY_ARGS, hcdlm_tiny_config
from dihal_fast.train.checkpoint import latest_checkpoint


@pytest.fixture(scope="module")
def sudoku4():
    task = SudokuTask(2, 2)
    task.pool = generate_pool(task.geo, 40, "singles", seed=0)
    return task


def _model(power: float = 1.0, floor: float = 0.0) -> HCDLM:
    torch.manual_seed(0)
    config = HCDLMModelConfig(latent_schedule_power=power, scaffold_floor=floor, **HCDLM_TINY)
    return HCDLM(SudokuTask(2, 2).spec, config)


def _plain(**overrides) -> ObjectiveConfig:
    """No exposure inputs, so the only latent noising is x_t's."""
    return ObjectiveConfig(exposure_share=0.0, **overrides)


@pytest.mark.parametrize("power", [0.5, 2.0, 3.0])
def test_latent_step_is_exact_on_its_own_levels(power):
    """Given the true x_0, one step from level a = (t/N)^p lands on the same path at b = ((t-1)/N)^p."""
    x0, eps = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    steps = 7
    for t in range(steps, 0, -1):
        x_t = LATENT_FLOW.noise(x0, torch.full((4,), latent_level(t / steps, power)), eps)
        expected = LATENT_FLOW.noise(x0, torch.full((4,), latent_level((t - 1) / steps, power)), eps)
        assert torch.allclose(latent_step(x_t, x0, t, steps, power), expected, atol=1e-5)
    assert latent_level(0.5, power) == pytest.approx(0.5**power)
    with pytest.raises(ValueError, match="step"):
        latent_step(x0, x0, 0, steps, power)


def test_power_one_is_the_old_euler_step_bit_for_bit():
    x, x_hat = torch.randn(3, 1, 8), torch.randn(3, 1, 8)
    for t in (1, 2, 5, 50):
        assert torch.equal(latent_step(x, x_hat, t, 50, 1.0), LATENT_FLOW.euler_step(x, x_hat, t))
    s = torch.rand(5)
    assert latent_level(s, 1.0) is s


@pytest.mark.parametrize("power", [1.0, 2.0])
def test_training_noises_the_latent_to_its_own_level(sudoku4, monkeypatch, power):
    """x_t is noised to s ** p where the denoiser (and the scaffold) are at level s."""
    model = _model(power)
    levels, seen = [], []
    noise = LATENT_FLOW.noise
    monkeypatch.setattr(objective.LATENT_FLOW, "noise", lambda x, s, e: levels.append(s.clone()) or noise(x, s, e))
    model.denoiser.register_forward_hook(lambda module, args, out: seen.append(args[2].clone()))
    context, target = sudoku4.train_batch(random.Random(0), 16)
    hcdlm_loss(model, UniformKernel(4), context, target, _plain(), torch.Generator().manual_seed(0))
    assert len(levels) == 1 and torch.allclose(levels[0], seen[0] ** power)
    assert bool((levels[0] < seen[0]).all()) == (power > 1) or bool((seen[0] == 1).any())


def test_latent_schedule_power_changes_the_loss(sudoku4):
    context, target = sudoku4.train_batch(random.Random(0), 16)
    losses = [
        hcdlm_loss(_model(p), UniformKernel(4), context, target, _plain(), torch.Generator().manual_seed(0))[0].item()
        for p in (1.0, 2.0)
    ]
    assert losses[0] != pytest.approx(losses[1], rel=1e-4)


def test_sampler_carries_the_latent_on_its_own_levels(sudoku4):
    """Every recorded step obeys x_{t-1} = x_hat + ((t-1)/t)^p (x_t - x_hat): the sampler feeds x_{t-1}
    forward (it never re-encodes the tokens)."""
    model, power, steps = _model(2.0).eval(), 2.0, 6
    context, _ = sudoku4.train_batch(random.Random(1), 3)
    trace = []
    sample_hcdlm(
        model,
        UniformKernel(4),
        context,
        SampleConfig(steps=steps),
        torch.Generator().manual_seed(0),
        on_step=lambda t, x, x_hat, *_: trace.append((t, x.clone(), x_hat.clone())),
    )
    assert [t for t, *_ in trace] == list(range(steps, 0, -1))
    for (t, x, x_hat), (_, x_next, _) in zip(trace, trace[1:]):
        assert torch.allclose(x_next, x_hat + ((t - 1) / t) ** power * (x - x_hat), atol=1e-5)
        assert not torch.allclose(x_next, x - (x - x_hat) / t, atol=1e-4)  # not the shared-level step


def test_scaffold_level_is_the_floor_plus_the_rest_of_the_way():
    s = torch.rand(7, dtype=torch.float64)
    assert scaffold_level(s, 0.0) is s  # the paper's: the scaffold at s itself
    assert torch.allclose(scaffold_level(s, 0.4), 0.4 + 0.6 * s)
    assert scaffold_level(1.0, 0.4) == 1.0 and scaffold_level(0.0, 0.4) == pytest.approx(0.4)


@pytest.mark.parametrize("floor", [0.0, 0.5])
def test_training_corrupts_the_scaffold_to_its_floored_level(sudoku4, monkeypatch, floor):
    """The scaffold is drawn at ``f + (1 - f) s`` where the denoiser (and the latent) are at level ``s``; without a
    floor the positions hit are a share ``s`` (the kernel's own draw, unchanged)."""
    model, kernel = _model(floor=floor), UniformKernel(4)
    levels, seen = [], []
    corrupt = kernel.corrupt_with_mask
    monkeypatch.setattr(kernel, "corrupt_with_mask", lambda k, s, g: levels.append(s.clone()) or corrupt(k, s, g))
    model.denoiser.register_forward_hook(lambda module, args, out: seen.append(args[2].clone()))
    context, target = sudoku4.train_batch(random.Random(0), 16)
    hcdlm_loss(model, kernel, context, target, _plain(), torch.Generator().manual_seed(0))
    assert len(levels) == 1 and torch.allclose(levels[0].float(), floor + (1 - floor) * seen[0])


def test_sampler_renoises_the_scaffold_to_its_floored_levels(sudoku4, monkeypatch):
    """Each step re-noises ``k_hat_0`` to ``f + (1 - f)(t - 1)/N``: never below the floor, the last re-noise
    included."""
    model, kernel, steps, floor = _model(floor=0.5).eval(), UniformKernel(4), 5, 0.5
    levels = []
    renoise = kernel.renoise
    monkeypatch.setattr(kernel, "renoise", lambda k, s, *rest: levels.append(s) or renoise(k, s, *rest))
    context, _ = sudoku4.train_batch(random.Random(1), 3)
    sample_hcdlm(model, kernel, context, SampleConfig(steps=steps), torch.Generator().manual_seed(0))
    assert levels == pytest.approx([floor + (1 - floor) * (t - 1) / steps for t in range(steps, 1, -1)])


def test_scaffold_floor_changes_the_loss(sudoku4):
    context, target = sudoku4.train_batch(random.Random(0), 16)
    losses = [
        hcdlm_loss(_model(floor=f), UniformKernel(4), context, target, _plain(), torch.Generator().manual_seed(0))[0]
        for f in (0.0, 0.5)
    ]
    assert losses[0].item() != pytest.approx(losses[1].item(), rel=1e-4)


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_blind_rows_get_an_all_mask_scaffold(sudoku4, share):
    model = _model()
    scaffolds = []
    model.denoiser.register_forward_hook(lambda module, args, out: scaffolds.append(args[1]))
    context, target = sudoku4.train_batch(random.Random(0), 32)
    hcdlm_loss(model, UniformKernel(4), context, target, _plain(scaffold_blind=share), torch.Generator().manual_seed(0))
    blind = (scaffolds[-1] == model.mask_id).all(1)
    assert not bool(((scaffolds[-1] == model.mask_id) & ~blind[:, None]).any())  # all of a row or none
    assert float(blind.float().mean()) == pytest.approx(share, abs=0.25)
    assert bool(blind.all()) == (share == 1.0) and bool(blind.any()) == (share > 0)


def test_blind_rows_are_scored_at_level_one_and_change_the_loss(sudoku4):
    """With every scaffold blind, the 'schedule' token term is the mean CE over all positions."""
    from torch.nn import functional as F

    model = _model()
    outputs = []
    model.denoiser.register_forward_hook(lambda module, args, out: outputs.append(out[0]))
    context, target = sudoku4.train_batch(random.Random(0), 8)
    only_token = {"lambda_recon": 0, "lambda_ent": 0, "lambda_cont": 0, "mask_aux_weight": 0, "slot_aux_weight": 0}
    cfg = _plain(scaffold_blind=1.0, token_weighting="schedule", **only_token)
    _, parts = hcdlm_loss(model, UniformKernel(4), context, target, cfg, torch.Generator().manual_seed(0))
    expected = F.cross_entropy(model.predictor(outputs[-1], context).transpose(1, 2), target).detach()
    assert parts["token"] == pytest.approx(float(expected), rel=1e-5)
    seeing = _plain(token_weighting="schedule", **only_token)
    assert hcdlm_loss(model, UniformKernel(4), context, target, seeing, torch.Generator().manual_seed(0))[1][
        "token"
    ] != pytest.approx(parts["token"], rel=1e-4)


@pytest.mark.parametrize("share", [0.5, 1.0])
def test_blind_rows_stay_at_level_one_when_guidance_drops_scaffolds_too(sudoku4, monkeypatch, share):
    """Regression: with ``scaffold_blind`` and ``guidance_training`` together, a blind row (all-[MASK] scaffold, every
    position hit) reaches the token term at level 1, as it does without guidance; the other rows at their ``s < 1``
    (``scaffold_drop`` 0: the drop takes no row, so only the level handed through it is tested)."""
    model = _model()
    scaffolds, levels = [], []
    model.denoiser.register_forward_hook(lambda module, args, out: scaffolds.append(args[1]))
    token_term = objective.token_term

    def spy(logits, target, hit, level, weighting):
        levels.append(level)
        return token_term(logits, target, hit, level, weighting)

    monkeypatch.setattr(objective, "token_term", spy)
    context, target = sudoku4.train_batch(random.Random(0), 16)
    cfg = _plain(scaffold_blind=share, guidance_training=True, scaffold_drop=0.0, token_weighting="schedule")
    hcdlm_loss(model, UniformKernel(4), context, target, cfg, torch.Generator().manual_seed(0))
    blind = (scaffolds[-1] == model.mask_id).all(1)
    assert bool(blind.any()) and bool((levels[-1][blind] == 1).all()) and bool((levels[-1][~blind] < 1).all())


def test_drop_scaffolds_keeps_the_level_of_the_rows_it_does_not_drop():
    """``drop_scaffolds(..., level, share, ...)``: dropped rows get random tokens, every position hit and level 1;
    the others keep their scaffold, hit and the ``level`` handed in (not ``s``)."""
    scaffold, hit = torch.zeros(4, 16, dtype=torch.long), torch.zeros(4, 16, dtype=torch.bool)
    level = torch.tensor([0.25, 1.0, 0.5, 1.0])
    kept = objective.drop_scaffolds(UniformKernel(4), scaffold, hit, level, 0.0, torch.Generator().manual_seed(0))
    assert torch.equal(kept[0], scaffold) and torch.equal(kept[1], hit) and torch.equal(kept[2], level)
    dropped = objective.drop_scaffolds(UniformKernel(4), scaffold, hit, level, 1.0, torch.Generator().manual_seed(0))
    assert bool(dropped[1].all()) and torch.equal(dropped[2], torch.ones(4)) and bool((dropped[0] != 0).any())


def _tiny_run(tmp_path, power: float):
    config = hcdlm_tiny_config(
        model={"latent_schedule_power": power}, objective={"scaffold_blind": 0.25}, warmup_steps=1
    )
    train(config, tmp_path)
    return tmp_path


def test_ablations_noise_the_latent_to_the_runs_level(tmp_path, monkeypatch):
    run = load_run(_tiny_run(tmp_path, 2.0), device="cpu")
    from dihal_fast.hcdlm.eval_data import generated_sudoku

    levels = []
    noise = LATENT_FLOW.noise
    monkeypatch.setattr(mechanism.LATENT_FLOW, "noise", lambda x, s, e: levels.append(s) or noise(x, s, e))
    mechanism.ablation_readout(run, generated_sudoku(run.task, "easy", 4, seed=1), (0.3, 0.5))
    assert [round(float(s[0]), 6) for s in levels] == [0.09, 0.25]


def test_runs_saved_before_these_options_keep_their_meaning(tmp_path):
    _tiny_run(tmp_path, 2.0)
    data = json.loads((latest_checkpoint(tmp_path) / "config.json").read_text())
    data["model"].pop("latent_schedule_power")
    data["model"].pop("scaffold_floor")
    data["objective"].pop("scaffold_blind")
    old = RunConfig.from_dict(data)
    assert old.model.latent_schedule_power == 1.0 and old.objective.scaffold_blind == 0.0
    assert old.model.scaffold_floor == 0.0


def test_a_run_saved_before_scaffold_floor_resumes_and_one_with_another_floor_is_refused(tmp_path):
    """Regression: a checkpoint whose config has no ``scaffold_floor`` (saved before the field) resumes as trained
    (its legacy value 0); a resume that asks for another floor is refused before any step."""
    train(hcdlm_tiny_config(2, warmup_steps=1), tmp_path)
    checkpoint = latest_checkpoint(tmp_path) / "config.json"
    data = json.loads(checkpoint.read_text())
    data["model"].pop("scaffold_floor")
    checkpoint.write_text(json.dumps(data))
    train(hcdlm_tiny_config(4, warmup_steps=1), tmp_path)
    assert latest_checkpoint(tmp_path).name.endswith("4")
    with pytest.raises(ValueError, match="scaffold_floor"):
        train(hcdlm_tiny_config(6, model={"scaffold_floor": 0.5}, warmup_steps=1), tmp_path)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--latent-schedule-power", "0"], "latent_schedule_power"),
        (["--scaffold-blind", "1.5"], "scaffold_blind"),
        (["--scaffold-floor", "1"], "scaffold_floor"),
        (["--scaffold-floor", "-0.1"], "scaffold_floor"),
    ],
)
def test_bad_values_are_one_line_errors(tmp_path, capsys, flags, message):
    argv = ["hcdlm", "train", "--task", "sudoku", "--out", str(tmp_path / "run"), "--steps", "1", *HCDLM_TINY_ARGS]
    assert main([*argv, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()
