"""In-sampler interventions (``sample_hcdlm(intervention=...)``): each replaces exactly the state it names at every
step, on a tiny untrained 4x4 HC-DLM; and the paired bootstrap they are reported with."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dihal_fast.hcdlm.config import HCDLMModelConfig, SampleConfig
from dihal_fast.hcdlm.mechanism import _batches
from dihal_fast.hcdlm.networks import HCDLM
from dihal_fast.hcdlm.noise import AbsorbingKernel, UniformKernel, latent_level, latent_step
from dihal_fast.hcdlm.sampler import INTERVENTIONS, sample_hcdlm
from dihal_fast.hcdlm.stats import paired_bootstrap
from dihal_fast.tasks.sudoku_task import SudokuTask, generate_pool
from dihal_fast.testing.tiny import HCDLM_TINY

STEPS, POWER = 5, 2.0


@pytest.fixture(scope="module")
def setup():
    task = SudokuTask(2, 2)
    task.pool = generate_pool(task.geo, 20, "singles", seed=0)
    torch.manual_seed(0)
    model = HCDLM(task.spec, HCDLMModelConfig(latent_schedule_power=POWER, **HCDLM_TINY)).eval()
    for module in model.modules():  # adaLN-Zero starts every block as the identity: open them
        if getattr(module, "modulation", None) is not None:
            torch.nn.init.normal_(module.modulation.weight, std=0.2)
    context, _ = task.train_batch(random.Random(0), 6)
    return model, context


def _denoiser_inputs(model, kernel, context, intervention, seed=1):
    """``(tokens, [(x_t, scaffold, x_hat_0, k_hat_0)] per step)``."""
    steps: list[tuple[torch.Tensor, ...]] = []
    tokens = sample_hcdlm(
        model,
        kernel,
        context,
        SampleConfig(steps=STEPS),
        torch.Generator().manual_seed(seed),
        on_step=lambda t, x, x_hat, k, clean: steps.append((x.clone(), k.clone(), x_hat.clone(), clean.clone())),
        intervention=intervention,
    )
    return tokens, steps


def _carried(steps, i: int) -> torch.Tensor:
    """The latent the normal chain would carry from step ``i`` (0 = the first, t = N) to the next."""
    x, _, x_hat, _ = steps[i]
    return latent_step(x, x_hat, STEPS - i, STEPS, POWER)


def test_without_an_intervention_the_latent_is_carried(setup):
    model, context = setup
    _, steps = _denoiser_inputs(model, UniformKernel(4), context, None)
    for i in range(STEPS - 1):
        assert torch.allclose(steps[i + 1][0], _carried(steps, i), atol=1e-6)


def test_latent_other_hands_each_chain_the_next_puzzles_latent(setup):
    model, context = setup
    _, steps = _denoiser_inputs(model, UniformKernel(4), context, "latent_other")
    for i in range(STEPS - 1):
        assert torch.allclose(steps[i + 1][0], _carried(steps, i).roll(1, dims=0), atol=1e-6)


def test_latent_prior_gives_the_denoiser_a_fresh_draw_every_step(setup):
    model, context = setup
    _, steps = _denoiser_inputs(model, UniformKernel(4), context, "latent_prior")
    draws = torch.stack([x for x, *_ in steps])
    for i in range(STEPS - 1):
        assert not torch.allclose(steps[i + 1][0], _carried(steps, i), atol=1e-2)
    assert abs(float(draws.mean())) < 0.1 and abs(float(draws.std()) - 1.0) < 0.1


def test_latent_reencoded_carries_only_the_tokens(setup):
    """Every carried latent is the encoder mean of the step's argmax tokens plus fresh noise at the next level, and
    the answer is the read-out of the last tokens' code exactly."""
    model, context = setup
    tokens, steps = _denoiser_inputs(model, UniformKernel(4), context, "latent_reencoded")
    for i in range(STEPS - 1):
        level = latent_level((STEPS - i - 1) / STEPS, POWER)
        code = model.encoder(steps[i][3], context)[0].detach()
        eps = (steps[i + 1][0] - (1 - level) * code) / level
        assert abs(float(eps.std()) - 1.0) < 0.15  # a fresh N(0, I) draw ...
        before = steps[i][0] - steps[i][0].mean()
        corr = float((eps * before).mean() / (eps.std() * before.std()))
        assert abs(corr) < 0.2  # ... that has nothing of the latent before
    last_code = model.encoder(steps[-1][3], context)[0].detach()
    assert torch.equal(tokens, model.predictor(last_code, context).argmax(-1))


def test_scaffold_prior_redraws_the_scaffold(setup):
    model, context = setup
    absorbing = AbsorbingKernel(4)
    _, normal = _denoiser_inputs(model, absorbing, context, None)
    _, reset = _denoiser_inputs(model, absorbing, context, "scaffold_prior")
    assert all(bool((k == absorbing.mask_id).all()) for _, k, *_ in reset)  # the absorbing prior: all [MASK]
    assert any(not bool((k == absorbing.mask_id).all()) for _, k, *_ in normal[1:])


def test_bad_interventions_are_refused_in_one_line(setup):
    model, context = setup
    latent_dm = HCDLM(SudokuTask(2, 2).spec, HCDLMModelConfig(**HCDLM_TINY), scaffold=False).eval()
    cases = [
        (model, context, "latent_noise", "intervention must be one of"),
        (latent_dm, context, "scaffold_prior", "needs a model with a scaffold"),
        (model, context[:1], "latent_other", "batch of at least 2"),
    ]
    for net, rows, name, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            sample_hcdlm(net, UniformKernel(4), rows, SampleConfig(steps=2), intervention=name)
        assert "\n" not in str(info.value)
    assert set(INTERVENTIONS) == {"latent_prior", "latent_other", "latent_reencoded", "scaffold_prior"}


@pytest.mark.parametrize(("count", "size"), [(7, 3), (6, 3), (1, 4), (9, 4), (2, 1)])
def test_batches_cover_every_example_once_and_never_leave_one_alone(count, size):
    parts = _batches(count, size)
    assert [i for part in parts for i in part] == list(range(count))
    assert all(len(part) >= 2 for part in parts) or count == 1


def test_paired_bootstrap_against_a_float64_loop():
    rng = np.random.default_rng(3)
    a, b = rng.random(40), rng.random(40)
    got = paired_bootstrap(a, b, resamples=500, seed=7)
    draws = np.random.default_rng(7).integers(0, 40, size=(500, 40))
    means = np.array([np.mean([a[i] - b[i] for i in row]) for row in draws])
    assert got["difference"] == pytest.approx(float(np.mean(a - b)))
    assert (got["low"], got["high"]) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))
    assert got["low"] <= got["difference"] <= got["high"] and got["n"] == 40


def test_two_stage_paired_bootstrap_against_a_float64_loop():
    rng = np.random.default_rng(5)
    a, b = rng.random((3, 25)), rng.random((3, 25))  # 3 training seeds x 25 test puzzles
    got = paired_bootstrap(a, b, resamples=300, seed=11)
    draws = np.random.default_rng(11)
    seeds = draws.integers(0, 3, size=(300, 3))
    puzzles = draws.integers(0, 25, size=(300, 25))
    means = [np.mean([a[s, p] - b[s, p] for s in row_s for p in row_p]) for row_s, row_p in zip(seeds, puzzles)]
    assert got["difference"] == pytest.approx(float(np.mean(a - b)))
    assert (got["low"], got["high"]) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))
    assert (got["n"], got["examples"]) == (3, 25)


def test_two_stage_interval_holds_the_seeds_spread():
    # every puzzle agrees within a seed, seeds disagree: the interval must be as wide as the seeds' spread
    offsets = np.array([[-0.2], [0.0], [0.2]])
    wide = paired_bootstrap(offsets + np.zeros((3, 40)), np.zeros((3, 40)), resamples=500)
    assert wide["low"] < -0.1 and wide["high"] > 0.1
    one_row = paired_bootstrap(np.full((1, 40), 0.25), np.zeros((1, 40)))
    assert one_row["low"] == one_row["high"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="paired bootstrap"):
        paired_bootstrap(np.zeros((2, 3)), np.zeros((3, 2)))


def test_paired_bootstrap_edge_cases_and_coverage():
    same = paired_bootstrap([0.2, 0.5, 0.9], [0.2, 0.5, 0.9])
    assert (same["difference"], same["low"], same["high"]) == (0.0, 0.0, 0.0)
    shifted = paired_bootstrap([1.5, 2.5, 3.5], [1.0, 2.0, 3.0])
    assert shifted["low"] == pytest.approx(0.5) and shifted["high"] == pytest.approx(0.5)
    rng = np.random.default_rng(0)
    covered = 0
    for trial in range(100):  # the 95 % interval holds the true difference (0.3) in most draws
        shared = rng.normal(size=30)
        interval = paired_bootstrap(shared + 0.3 + rng.normal(0, 0.5, 30), shared, resamples=400, seed=trial)
        covered += interval["low"] <= 0.3 <= interval["high"]
    assert covered >= 85
    for bad in (([], []), ([1.0], [1.0, 2.0])):
        with pytest.raises(ValueError, match="paired bootstrap"):
            paired_bootstrap(*bad)
