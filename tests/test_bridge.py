"""The diffusion bridge: schedules, parameterisations, samplers (against exact and analytic denoisers),
causality and caching of the bridge network."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dihal_fast.bridge import (
    SAMPLERS,
    Bridge,
    BridgeCache,
    BridgeConfig,
    CosineSchedule,
    FlowSchedule,
    Prediction,
    make_sampler,
    make_schedule,
    position_noise,
)

VALID_PAIRS = [("cosine", "eps"), ("cosine", "x0"), ("cosine", "velocity"), ("flow", "x0"), ("flow", "velocity")]


def test_schedule_endpoints():
    flow = FlowSchedule()
    alpha, sigma = flow.alpha_sigma(torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert alpha.tolist() == [1.0, 0.0] and sigma.tolist() == [0.0, 1.0]
    cosine = CosineSchedule(logsnr_min=-10.0, logsnr_max=10.0)
    ends = torch.tensor([0.0, 1.0], dtype=torch.float64)
    alpha, sigma = cosine.alpha_sigma(ends)
    assert alpha[0] ** 2 == pytest.approx(1 / (1 + math.exp(-10)), rel=1e-12)
    assert alpha[1] ** 2 == pytest.approx(1 / (1 + math.exp(10)), rel=1e-9)
    assert cosine.logsnr(ends).tolist() == pytest.approx([10.0, -10.0], abs=1e-9)


@given(t=st.floats(0.0, 1.0), name=st.sampled_from(["cosine", "flow"]))
def test_schedule_derivatives_match_finite_differences(t, name):
    schedule = make_schedule(name)
    h = 1e-6
    lo, hi = max(0.0, t - h), min(1.0, t + h)
    a_lo, s_lo = schedule.alpha_sigma(torch.tensor(lo, dtype=torch.float64))
    a_hi, s_hi = schedule.alpha_sigma(torch.tensor(hi, dtype=torch.float64))
    d_alpha, d_sigma = schedule.derivatives(torch.tensor((lo + hi) / 2, dtype=torch.float64))  # central difference
    assert float(d_alpha) == pytest.approx(float(a_hi - a_lo) / (hi - lo), rel=1e-5, abs=1e-6)
    assert float(d_sigma) == pytest.approx(float(s_hi - s_lo) / (hi - lo), rel=1e-5, abs=1e-6)
    if name == "cosine":
        alpha, sigma = schedule.alpha_sigma(torch.tensor(t, dtype=torch.float64))
        assert float(alpha**2 + sigma**2) == pytest.approx(1.0, abs=1e-12)


@given(pair=st.sampled_from(VALID_PAIRS), t=st.floats(0.02, 0.98), seed=st.integers(0, 2**16))
def test_prediction_target_inverts(pair, t, seed):
    schedule, prediction = make_schedule(pair[0]), Prediction(pair[1])
    generator = torch.Generator().manual_seed(seed)
    x0, eps = torch.randn(2, 5, 3, generator=generator, dtype=torch.float64).unbind(0)
    time = torch.tensor(t, dtype=torch.float64)
    alpha, sigma = schedule.alpha_sigma(time)
    z = alpha * x0 + sigma * eps
    x0_hat, eps_hat = prediction.to_x0_eps(prediction.target(x0, eps, time, schedule), z, time, schedule)
    torch.testing.assert_close(x0_hat, x0, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(eps_hat, eps, rtol=1e-9, atol=1e-9)


def test_bad_schedule_and_prediction_are_rejected():
    with pytest.raises(ValueError, match="alpha"):
        Prediction("eps").check_schedule(FlowSchedule())
    with pytest.raises(ValueError, match="prediction must be one of"):
        Prediction("score")
    with pytest.raises(ValueError, match="schedule must be one of"):
        make_schedule("linear")
    with pytest.raises(ValueError, match="sampler must be one of"):
        make_sampler("dpm")
    with pytest.raises(ValueError, match="nfe must be >= 1"):
        make_sampler("ddim").steps(0)


def _oracle(x0: torch.Tensor, schedule, prediction):
    """A model that knows x0: outputs the target implied by (z, t) and the true x0."""

    def model(z, t):
        alpha, sigma = schedule.alpha_sigma(t)
        return prediction.target(x0, (z - alpha * x0) / sigma, t, schedule)

    return model


@pytest.mark.parametrize("pair", VALID_PAIRS)
@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
@pytest.mark.parametrize("nfe", [1, 2, 3, 6])
def test_samplers_return_exact_x0_for_an_exact_model(pair, sampler, nfe):
    schedule, prediction = make_schedule(pair[0]), Prediction(pair[1])
    generator = torch.Generator().manual_seed(nfe)
    x0 = 3.0 * torch.randn(4, 7, 5, generator=generator, dtype=torch.float64) + 1.0
    noise = torch.randn(nfe, 4, 7, 5, generator=generator, dtype=torch.float64)
    out = make_sampler(sampler).sample(
        _oracle(x0, schedule, prediction), schedule, prediction, noise[0], nfe, noise[1:]
    )
    torch.testing.assert_close(out, x0, rtol=1e-7, atol=1e-7)


def _gaussian_denoiser(mean: float, std: float, schedule, prediction):
    """The exact E[x0 | z_t] for data x0 ~ N(mean, std^2), returned in ``prediction``'s terms."""

    def model(z, t):
        alpha, sigma = schedule.alpha_sigma(t)
        gain = alpha * std**2 / (alpha**2 * std**2 + sigma**2)
        x0 = mean + gain * (z - alpha * mean)
        return prediction.target(x0, (z - alpha * x0) / sigma, t, schedule)

    return model


@pytest.mark.parametrize("pair", [("cosine", "eps"), ("cosine", "x0"), ("flow", "velocity")])
@pytest.mark.parametrize("sampler,nfe", [("ddim", 40), ("euler", 80), ("heun", 41), ("ddpm", 80)])
def test_samplers_draw_the_data_distribution_with_the_exact_score(pair, sampler, nfe):
    """With the analytic denoiser of a Gaussian, the samples have the data's mean and spread."""
    schedule, prediction = make_schedule(pair[0]), Prediction(pair[1])
    generator = torch.Generator().manual_seed(0)
    noise = torch.randn(nfe, 20000, dtype=torch.float64, generator=generator)
    chosen = make_sampler(sampler)
    samples = chosen.sample(
        _gaussian_denoiser(2.0, 0.5, schedule, prediction), schedule, prediction, noise[0], nfe, noise[1:]
    )
    assert float(samples.mean()) == pytest.approx(2.0, abs=0.02)
    assert float(samples.std()) == pytest.approx(0.5, abs=0.03)


def test_stochastic_sampler_requires_noise():
    schedule, prediction = FlowSchedule(), Prediction("velocity")
    model = _oracle(torch.zeros(3), schedule, prediction)
    with pytest.raises(ValueError, match="noise draws"):
        make_sampler("ddpm").sample(model, schedule, prediction, torch.randn(3), 4, None)


def _bridge(seed: int = 0, **overrides) -> Bridge:
    torch.manual_seed(seed)
    options = dict(
        hidden_size=16, condition_size=12, layer=1, width=16, heads=2, context_layers=2, unet_depth=2, time_dim=8
    )
    bridge = Bridge(BridgeConfig(**{**options, **overrides})).eval()
    torch.nn.init.normal_(bridge.out.weight, std=0.3)  # the zero-initialised head would hide every dependency
    return bridge


@given(length=st.integers(2, 9), changed=st.integers(0, 8), seed=st.integers(0, 100))
def test_bridge_is_causal_along_the_sequence(length, changed, seed):
    changed = changed % length
    bridge = _bridge()
    generator = torch.Generator().manual_seed(seed)
    condition = torch.randn(2, length, 12, generator=generator)
    positions = torch.arange(length).expand(2, length)
    noise = position_noise(seed, positions, 2, 16)
    with torch.no_grad():
        before = bridge.sample(bridge.encode(condition, positions), noise)
        condition[:, changed] = torch.randn(2, 12, generator=generator)
        after = bridge.sample(bridge.encode(condition, positions), noise)
    assert torch.equal(before[:, :changed], after[:, :changed])
    assert not torch.allclose(before[:, changed], after[:, changed])


@given(cuts=st.lists(st.integers(1, 10), min_size=1, max_size=4), pad=st.integers(0, 3))
def test_bridge_cache_equals_full_recompute(cuts, pad):
    """Encoding in chunks through the cache (with left padding) gives the full-sequence context."""
    bridge = _bridge()
    length = 11
    condition = torch.randn(2, length, 12, generator=torch.Generator().manual_seed(len(cuts)))
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, :pad] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        full = bridge.encode(condition, positions, mask)
        cache, pieces, start = BridgeCache(bridge.config.context_layers), [], 0
        for end in sorted({min(c + start, length) for c in cuts} | {length}):
            if end <= start:
                continue
            pieces.append(bridge.encode(condition[:, start:end], positions[:, start:end], mask[:, :end], cache))
            start = end
    assert cache.length == length
    for level, reference in enumerate(full):
        torch.testing.assert_close(
            torch.cat([p[level] for p in pieces], dim=1)[1, pad:], reference[1, pad:], atol=1e-5, rtol=1e-5
        )
        torch.testing.assert_close(torch.cat([p[level] for p in pieces], dim=1)[0], reference[0], atol=1e-5, rtol=1e-5)


def test_one_token_at_a_time_without_a_mask_equals_full_recompute():
    """The decoding path (one new token, no padding mask: attention without a mask) gives the full context."""
    bridge = _bridge()
    condition = torch.randn(2, 6, 12, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(6).expand(2, 6)
    with torch.no_grad():
        full = bridge.encode(condition, positions)
        cache = BridgeCache(bridge.config.context_layers)
        steps = [bridge.encode(condition[:, i : i + 1], positions[:, i : i + 1], None, cache) for i in range(6)]
    for level, reference in enumerate(full):
        torch.testing.assert_close(torch.cat([s[level] for s in steps], dim=1), reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("sampler", "nfe"), [("ddim", 1), ("ddim", 3), ("heun", 3)])
def test_cached_time_features_give_the_same_samples(sampler, nfe):
    """Modulations kept in the cache per sampler time reproduce the uncached samples exactly."""
    bridge = _bridge()
    for block in [*bridge.down_blocks, bridge.middle, *bridge.up_blocks]:
        torch.nn.init.normal_(block.film.weight, std=0.3)  # zero-initialised FiLM would not depend on t
    positions = torch.arange(4).expand(2, 4)
    noise = position_noise(3, positions, nfe, 16)
    with torch.no_grad():
        context = bridge.encode(torch.randn(2, 4, 12), positions)
        plain = bridge.sample(context, noise, nfe, sampler)
        cache = BridgeCache(bridge.config.context_layers)
        first, again = (bridge.sample(context, noise, nfe, sampler, cache) for _ in range(2))
    assert torch.equal(plain, first) and torch.equal(first, again)
    assert 1 <= len(cache.modulations) <= nfe


def test_position_noise_depends_only_on_seed_position_and_row():
    positions = torch.arange(9).expand(3, 9)
    full = position_noise(7, positions, 3, 4)
    parts = torch.cat([position_noise(7, positions[:, :4], 3, 4), position_noise(7, positions[:, 4:], 3, 4)], dim=2)
    assert torch.equal(full, parts)
    shifted = position_noise(7, positions + 1, 3, 4)
    assert torch.equal(shifted[:, :, :-1], full[:, :, 1:])
    assert not torch.equal(position_noise(8, positions, 3, 4), full)


def test_fresh_bridge_predicts_the_mean_and_normalisation_round_trips():
    bridge = Bridge(BridgeConfig(hidden_size=6, condition_size=6, layer=2, width=8, heads=2))
    mean, std = torch.arange(6, dtype=torch.float64), 2.5
    bridge.set_target_statistics(mean, std)
    hidden = torch.randn(2, 3, 6)
    torch.testing.assert_close(bridge.denormalize(bridge.normalize(hidden)), hidden)
    positions = torch.arange(3).expand(2, 3)
    sampled = bridge.sample(bridge.encode(torch.randn(2, 3, 6), positions), torch.randn(2, 2, 3, 6))
    assert torch.equal(bridge.denormalize(sampled), mean.float().expand(2, 3, 6))
    assert BridgeConfig.from_dict(bridge.config.to_dict()) == bridge.config


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"heads": 3}, "heads of even size"),
        ({"nfe": 0}, "nfe"),
        ({"unet_depth": 9}, "unet_depth"),
        ({"schedule": "flow", "prediction": "eps"}, "alpha"),
        ({"target_mean": [0.0]}, "target_mean"),
    ],
)
def test_bridge_config_rejects_bad_values(bad, match):
    with pytest.raises(ValueError, match=match):
        BridgeConfig(**{"hidden_size": 16, "condition_size": 16, "layer": 1, "width": 16, **bad})


def test_bridge_config_from_dict_names_unknown_and_missing_keys():
    config = BridgeConfig(hidden_size=4, condition_size=4, layer=1, width=4, heads=1).to_dict()
    with pytest.raises(ValueError, match="unknown BridgeConfig keys"):
        BridgeConfig.from_dict({**config, "depth": 3})
    del config["layer"]
    with pytest.raises(ValueError, match="lacks the keys"):
        BridgeConfig.from_dict(config)
