"""HC-DLM pieces on tiny models: shapes, kernels' marginals, the Euler update, guidance, samplers, losses."""

from __future__ import annotations

import random

import pytest
import torch

from dihal_fast.common.sampling import sample_categorical
from dihal_fast.errors import DihalValueError
from dihal_fast.hcdlm.config import HCDLMModelConfig, ObjectiveConfig, RunConfig, SampleConfig
from dihal_fast.hcdlm.layers import Block, SlotPositions, count_parameters
from dihal_fast.hcdlm.models import build_model, generate, kind_of
from dihal_fast.hcdlm.networks import HCDLM, ARNet, MDMNet
from dihal_fast.hcdlm.noise import LATENT_FLOW, AbsorbingKernel, UniformKernel, make_kernel, noisy_token_probs
from dihal_fast.hcdlm.objective import hcdlm_loss
from dihal_fast.hcdlm.sampler import answer_log_prob, guided_x0, sample_ar, sample_hcdlm, sample_mdm
from dihal_fast.tasks.base import TaskSpec
from dihal_fast.tasks.countdown_task import CountdownTask
from dihal_fast.tasks.sudoku_task import SudokuTask, generate_pool
from dihal_fast.testing.tiny import HCDLM_TINY

KINDS = ("hcdlm", "latent", "mdm", "ar")
TINY = HCDLM_TINY
SHORTCUT_NET = {"slot_readout": True, "slot_head": True}  # the scaffold -> x_hat_0 paths of the shortcut design


@pytest.fixture(scope="module")
def sudoku4():
    task = SudokuTask(2, 2)
    task.pool = generate_pool(task.geo, 40, "singles", seed=0)
    return task


def _batch(task, n=6, seed=0):
    return task.train_batch(random.Random(seed), n)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which", ["sudoku", "countdown"])
def test_shapes_and_sampling(kind, which, sudoku4):
    torch.manual_seed(0)
    task = sudoku4 if which == "sudoku" else CountdownTask((3,), target_len=14)
    model = build_model(task.spec, HCDLMModelConfig(kind=kind, latents=2, **TINY)).eval()
    context, target = _batch(task)
    loss, parts = kind_of(model).loss(
        model,
        make_kernel("uniform", task.spec.target_vocab),
        context,
        target,
        RunConfig().objective,
        torch.Generator().manual_seed(0),
    )
    assert loss.dim() == 0 and torch.isfinite(loss) and parts["loss"] == pytest.approx(loss.item())
    out = generate(
        model,
        make_kernel("absorbing", task.spec.target_vocab),
        context,
        SampleConfig(steps=3),
        torch.Generator().manual_seed(1),
    )
    assert out.shape == target.shape and out.dtype == torch.long
    assert int(out.min()) >= 0 and int(out.max()) < task.spec.target_vocab


def test_hcdlm_module_shapes(sudoku4):
    cfg = HCDLMModelConfig(latents=3, **TINY)
    model = HCDLM(sudoku4.spec, cfg)
    context, target = _batch(sudoku4, 5)
    mean, logvar = model.encoder(target, context)
    assert mean.shape == logvar.shape == (5, 3, 8)
    assert torch.allclose(mean.mean(-1), torch.zeros(5, 3), atol=1e-5)  # layer-normalised means
    assert float(logvar.detach().max()) <= 0.0
    x_hat = model.denoiser(torch.randn(5, 3, 8), target, torch.rand(5), context)
    assert x_hat.shape == (5, 3, 8)
    assert model.predictor(mean, context).shape == (5, 16, 4)


@pytest.mark.parametrize("kind", KINDS)
def test_loss_decreases(kind, sudoku4):
    torch.manual_seed(0)
    model = build_model(sudoku4.spec, HCDLMModelConfig(kind=kind, **TINY))
    kernel = make_kernel("uniform", sudoku4.spec.target_vocab)
    context, target = _batch(sudoku4, 16)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for step in range(30):
        loss, _ = kind_of(model).loss(
            model, kernel, context, target, RunConfig().objective, torch.Generator().manual_seed(step % 3)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) / 5 < 0.85 * sum(losses[:5]) / 5


def test_baselines_match_the_parameter_budget(sudoku4):
    cfg = HCDLMModelConfig(hidden=64, heads=4)
    budget = count_parameters(build_model(sudoku4.spec, cfg))
    for kind in ("latent", "mdm", "ar"):
        assert (
            abs(count_parameters(build_model(sudoku4.spec, HCDLMModelConfig(kind=kind, hidden=64, heads=4))) - budget)
            < 0.15 * budget
        )


@pytest.mark.parametrize("kernel_cls", [UniformKernel, AbsorbingKernel])
def test_kernel_marginals_match_transition(kernel_cls):
    """Empirical frequencies of q(k_s | k_0) agree with the transition matrix (float64 draws)."""
    vocab, s, n = 5, 0.3, 200_000
    kernel = kernel_cls(vocab)
    tokens = torch.full((1, n), 2, dtype=torch.long)
    noisy = kernel.corrupt(tokens, s, torch.Generator().manual_seed(0))
    q = kernel.transition(s)
    assert torch.allclose(q.sum(1), torch.ones(q.shape[0], dtype=torch.float64))
    freq = torch.bincount(noisy.flatten(), minlength=q.shape[1]).double() / n
    assert torch.allclose(freq, q[2], atol=4e-3)
    clean = torch.softmax(torch.randn(7, vocab, dtype=torch.float64), -1)
    noisy_probs = noisy_token_probs(clean, kernel, s)
    assert torch.allclose(noisy_probs.sum(-1), torch.ones(7, dtype=torch.float64))
    assert torch.allclose(noisy_probs[:, :vocab], (1 - s) * clean + (s / vocab if kernel_cls is UniformKernel else 0.0))


def test_kernel_endpoints():
    uniform, absorbing = UniformKernel(6), AbsorbingKernel(6)
    tokens = torch.randint(6, (4, 30))
    for kernel in (uniform, absorbing):
        assert torch.equal(kernel.corrupt(tokens, 0.0), tokens)
    assert bool((absorbing.corrupt(tokens, 1.0) == 6).all()) and bool((absorbing.prior((2, 3)) == 6).all())
    with pytest.raises(ValueError):
        make_kernel("gaussian", 6)


def test_confidence_remasking_masks_least_confident():
    kernel = AbsorbingKernel(4)
    tokens = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 0, 1]])
    confidence = torch.tensor([[0.9, 0.1, 0.8, 0.2, 0.7, 0.3, 0.6, 0.4, 0.5, 0.95]])
    out = kernel.renoise(tokens, 0.4, confidence, mode="confidence")
    assert (out == 4).nonzero()[:, 1].tolist() == [1, 3, 5, 7]  # round(0.4 * 10) lowest confidences
    assert torch.equal(out[out != 4], tokens[out != 4])


def test_uniform_confidence_renoise_touches_only_least_confident():
    kernel = UniformKernel(1000)  # large vocabulary: a redrawn token almost never equals the old one
    tokens = torch.arange(10)[None].repeat(3, 1)
    confidence = torch.rand(3, 10, generator=torch.Generator().manual_seed(1))
    out = kernel.renoise(tokens, 0.3, confidence, torch.Generator().manual_seed(0), mode="confidence")
    lowest = confidence.argsort(dim=1)[:, :3]
    expected = torch.zeros(3, 10, dtype=torch.bool).scatter(1, lowest, True)
    assert torch.equal(out != tokens, expected)


def test_flow_noise_and_euler_step():
    x0, eps = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    s = torch.tensor([0.0, 0.5, 1.0])
    xs = LATENT_FLOW.noise(x0, s, eps)
    assert (
        torch.allclose(xs[0], x0[0]) and torch.allclose(xs[2], eps[2]) and torch.allclose(xs[1], (x0[1] + eps[1]) / 2)
    )
    # With the exact x0, one Euler step from level t lands on the flow at level t - 1.
    steps, t = 10, 7
    x_t = LATENT_FLOW.noise(x0, torch.full((3,), t / steps), eps)
    assert torch.allclose(
        LATENT_FLOW.euler_step(x_t, x0, t), LATENT_FLOW.noise(x0, torch.full((3,), (t - 1) / steps), eps), atol=1e-6
    )
    with pytest.raises(ValueError):
        LATENT_FLOW.euler_step(x_t, x0, 0)


def test_latent_flow_is_the_old_formulas_bit_for_bit():
    """The shared flow schedule computes HC-DLM's former ``(1 - s) x0 + s eps`` and ``x_t - (x_t - x_hat) / t``
    exactly (same operations in the same order), so seeded runs give the same numbers as before."""
    g = torch.Generator().manual_seed(0)
    x0, eps, x_hat = (torch.randn(5, 3, 4, generator=g) for _ in range(3))
    s = torch.rand(5, generator=g)
    level = s.view(-1, 1, 1)
    assert torch.equal(LATENT_FLOW.noise(x0, s, eps), (1 - level) * x0 + level * eps)
    for t in (1, 3, 7):
        assert torch.equal(LATENT_FLOW.euler_step(x0, x_hat, t), x0 - (x0 - x_hat) / t)


def test_objective_and_sampler_numbers_are_unchanged(sudoku4):
    """Fixed-seed loss, last latent and tokens recorded with the code before the flow schedule was shared
    (with the options of that time named: the hard log-variance clamp, the scaffold drop always on, the slot
    read-out and the slot head)."""
    context, target = _batch(sudoku4)
    torch.manual_seed(0)
    model = build_model(
        sudoku4.spec,
        HCDLMModelConfig(kind="hcdlm", kernel="uniform", latents=2, logvar_bound="clamp", **TINY, **SHORTCUT_NET),
    )
    kernel = make_kernel("uniform", 4)
    loss, _ = hcdlm_loss(
        model,
        kernel,
        context,
        target,
        ObjectiveConfig(exposure_share=0.5, latent_drop=0.1, guidance_training=True, slot_aux_weight=1.0),
        torch.Generator().manual_seed(3),
    )
    assert loss.item() == pytest.approx(5.574204921722412, rel=1e-6, abs=0)
    trace = []
    tokens = sample_hcdlm(
        model.eval(),
        kernel,
        context,
        SampleConfig(steps=4, cfg_weight=1.5),
        torch.Generator().manual_seed(5),
        on_step=lambda t, x, *_: trace.append(x.clone()),
    )
    expected_x = [
        0.23588255047798157,
        -0.8312816023826599,
        -0.7338953018188477,
        0.13681429624557495,
        0.3673851788043976,
        -0.019114729017019272,
        -0.24312230944633484,
        -1.0830706357955933,
    ]
    assert torch.allclose(trace[-1][0, 0], torch.tensor(expected_x), rtol=1e-5, atol=1e-6)
    assert tokens.tolist() == [
        [3, 0, 3, 0, 2, 2, 3, 3, 3, 3, 3, 3, 2, 2, 3, 3],
        [0, 0, 3, 3, 2, 2, 3, 3, 3, 3, 3, 3, 3, 2, 3, 3],
        [0, 0, 3, 3, 2, 2, 3, 3, 3, 1, 3, 3, 2, 2, 3, 3],
        [0, 0, 3, 0, 2, 2, 3, 3, 3, 3, 3, 3, 3, 2, 3, 3],
        [0, 0, 3, 3, 2, 2, 3, 3, 3, 3, 3, 3, 2, 2, 3, 3],
        [0, 0, 3, 3, 2, 2, 3, 3, 3, 3, 3, 3, 3, 2, 3, 3],
    ]


def test_sampler_follows_algorithm_2(sudoku4):
    """Recorded steps obey x_{t-1} = x_t - (x_t - x_hat_0)/t, levels go N..1, scaffolds are re-noised."""
    torch.manual_seed(0)
    model = HCDLM(sudoku4.spec, HCDLMModelConfig(kernel="absorbing", **TINY)).eval()
    context, _ = _batch(sudoku4, 3)
    trace = []
    sample_hcdlm(
        model,
        AbsorbingKernel(4),
        context,
        SampleConfig(steps=5),
        torch.Generator().manual_seed(0),
        on_step=lambda t, x, x_hat, k, _: trace.append((t, x.clone(), x_hat.clone(), k.clone())),
    )
    assert [t for t, *_ in trace] == [5, 4, 3, 2, 1]
    for (t, x, x_hat, _), (_, x_next, _, _) in zip(trace, trace[1:]):
        assert torch.allclose(x_next, x - (x - x_hat) / t, atol=1e-6)
    assert bool((trace[0][3] == 4).all())  # k_T = all [MASK]
    masked_per_step = [int((k == 4).sum(1)[0]) for *_, k in trace]
    assert masked_per_step == [16, round(16 * 4 / 5), round(16 * 3 / 5), round(16 * 2 / 5), round(16 * 1 / 5)]


@pytest.mark.parametrize("power", [1.0, 3.0])
def test_renoise_update_draws_the_next_latent_around_x_hat(sudoku4, power):
    """``latent_update="renoise"``: x_{t-1} = (1 - b) x_hat_0 + b eps with fresh N(0, I) noise at the latent's next
    level b (not the DDIM step)."""
    from dihal_fast.hcdlm.noise import latent_level, latent_step

    torch.manual_seed(0)
    model = HCDLM(sudoku4.spec, HCDLMModelConfig(latents=64, latent_schedule_power=power, **TINY)).eval()
    context, _ = _batch(sudoku4, 8)
    trace, steps = [], 4
    sample_hcdlm(
        model,
        UniformKernel(4),
        context,
        SampleConfig(steps=steps, latent_update="renoise"),
        torch.Generator().manual_seed(0),
        on_step=lambda t, x, x_hat, *_: trace.append((t, x.clone(), x_hat.clone())),
    )
    for (t, x, x_hat), (_, x_next, _) in zip(trace, trace[1:]):
        level = latent_level((t - 1) / steps, power)
        eps = (x_next - (1 - level) * x_hat) / level
        assert abs(float(eps.mean())) < 0.1 and abs(float(eps.std()) - 1) < 0.1
        assert not torch.allclose(x_next, latent_step(x, x_hat, t, steps, power))


def _recording_denoiser(model: HCDLM) -> list:
    """Every ``x_prev`` the denoiser is called with, in order (None or a copy)."""
    seen, forward = [], model.denoiser.forward

    def recorded(*args, x_prev=None, **kwargs):
        seen.append(None if x_prev is None else x_prev.clone())
        return forward(*args, x_prev=x_prev, **kwargs)

    model.denoiser.forward = recorded
    return seen


def test_self_conditioning_reads_the_previous_estimate(sudoku4):
    """Sampling: step N reads no estimate, every later step the x_hat_0 of the step before (the re-encoded latent
    under ``latent_reencoded``); training: half the batches read a no-grad first pass, which the loss reaches."""
    torch.manual_seed(0)
    model = HCDLM(sudoku4.spec, HCDLMModelConfig(self_condition=True, **TINY)).eval()
    assert HCDLM(sudoku4.spec, HCDLMModelConfig(**TINY)).denoiser.self_condition is None
    context, target = _batch(sudoku4, 3)
    x_t, s = torch.randn(3, 1, 8), torch.full((3,), 0.5)
    with torch.no_grad():
        x_hat = model.denoiser(x_t, target, s, context)
        assert torch.equal(model.denoiser(x_t, target, s, context, x_prev=torch.zeros_like(x_hat)), x_hat)
        assert not torch.allclose(model.denoiser(x_t, target, s, context, x_prev=x_hat), x_hat)
    seen, trace = _recording_denoiser(model), []
    on_step = lambda t, x, x_hat, k, clean: trace.append((x_hat.clone(), clean.clone()))  # noqa: E731

    def sample(steps: int, **intervention) -> None:
        sample_hcdlm(model, UniformKernel(4), context, SampleConfig(steps=steps), None, on_step, **intervention)

    sample(4)
    assert seen[0] is None and len(seen) == 4
    assert all(torch.equal(prev, x_hat) for prev, (x_hat, _) in zip(seen[1:], trace))
    seen.clear(), trace.clear()
    sample(3, intervention="latent_reencoded")
    with torch.no_grad():
        assert all(torch.equal(prev, model.encoder(clean, context)[0]) for prev, (_, clean) in zip(seen[1:], trace))
    model.train()
    read = []
    for seed in range(8):
        seen.clear()
        model.zero_grad()
        loss, _ = hcdlm_loss(
            model, UniformKernel(4), context, target, ObjectiveConfig(), torch.Generator().manual_seed(seed)
        )
        loss.backward()
        first_pass = seen[-1] is not None  # the main pass read an estimate: the one made just before, unread
        assert not first_pass or seen[-2] is None
        weight = model.denoiser.self_condition.weight
        grad = 0.0 if weight.grad is None else float(weight.grad.abs().sum())
        read.append(first_pass)
        assert (grad > 0) == first_pass
    assert 0 < sum(read) < len(read)


def test_classifier_free_guidance_combination(sudoku4):
    torch.manual_seed(0)
    model = HCDLM(sudoku4.spec, HCDLMModelConfig(**TINY)).eval()
    kernel = UniformKernel(4)
    context, target = _batch(sudoku4, 4)
    x_t, s = torch.randn(4, 1, 8), torch.full((4,), 0.5)
    with torch.no_grad():
        x_cond = model.denoiser(x_t, target, s, context)
        random_scaffold = kernel.random_tokens((4, 16), torch.Generator().manual_seed(3))
        x_uncond = model.denoiser(x_t, random_scaffold, s, context)
        guided = guided_x0(model, kernel, x_t, target, s, context, 2.75, torch.Generator().manual_seed(3))
        assert torch.allclose(guided, x_uncond + 2.75 * (x_cond - x_uncond), atol=1e-6)
        assert torch.equal(guided_x0(model, kernel, x_t, target, s, context, 0.0, None), x_cond)


@pytest.mark.parametrize("order", ["prob", "margin"])
def test_mdm_unmasks_on_schedule(order, sudoku4):
    torch.manual_seed(0)
    model = MDMNet(sudoku4.spec, HCDLMModelConfig(**TINY), blocks=1).eval()
    context, _ = _batch(sudoku4, 3)
    out = sample_mdm(model, context, SampleConfig(steps=4, order=order))
    assert not bool((out == model.mask_id).any())
    calls = []
    original = model.forward
    model.forward = lambda tokens, ctx: (calls.append(int((tokens == model.mask_id).sum(1)[0])), original(tokens, ctx))[
        1
    ]
    sample_mdm(model, context, SampleConfig(steps=4, order=order))
    assert calls == [16, 12, 8, 4]


def test_objective_parts_and_detach(sudoku4):
    model = HCDLM(sudoku4.spec, HCDLMModelConfig(**TINY))
    context, target = _batch(sudoku4, 4)
    from dihal_fast.hcdlm.objective import hcdlm_loss

    cfg = ObjectiveConfig(
        lambda_recon=0, lambda_ent=0, mask_aux_weight=0, lambda_token=0, exposure_share=0, slot_aux_weight=0
    )
    loss, parts = hcdlm_loss(model, UniformKernel(4), context, target, cfg, torch.Generator().manual_seed(0))
    loss.backward()
    assert set(parts) == {"recon", "neg_entropy", "cont", "loss"}
    assert all(
        p.grad is None or float(p.grad.abs().sum()) == 0 for p in model.encoder.parameters()
    )  # regression is detached
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in model.denoiser.parameters())


@pytest.mark.parametrize("weighting", ["all", "schedule"])
@pytest.mark.parametrize("exposure", [0.0, 1.0])
def test_token_term_trains_denoiser_and_predictor(sudoku4, weighting, exposure):
    """The per-step token term alone reaches the denoiser and the predictor, never the encoder."""
    from dihal_fast.hcdlm.objective import hcdlm_loss

    torch.manual_seed(0)
    model = HCDLM(sudoku4.spec, HCDLMModelConfig(**TINY))
    context, target = _batch(sudoku4, 4)
    cfg = ObjectiveConfig(
        lambda_recon=0,
        lambda_ent=0,
        lambda_cont=0,
        mask_aux_weight=0,
        slot_aux_weight=0,
        token_weighting=weighting,
        exposure_share=exposure,
    )
    loss, parts = hcdlm_loss(model, UniformKernel(4), context, target, cfg, torch.Generator().manual_seed(0))
    loss.backward()
    assert parts["token"] > 0 and parts["loss"] == pytest.approx(parts["token"])
    grads = {
        name: sum(float(p.grad.abs().sum()) for p in part.parameters() if p.grad is not None)
        for name, part in (("encoder", model.encoder), ("denoiser", model.denoiser), ("predictor", model.predictor))
    }
    assert grads["encoder"] == 0 and grads["denoiser"] > 0 and grads["predictor"] > 0


def test_slot_auxiliary_reaches_only_the_denoiser(sudoku4):
    """The training-only slot head (deep supervision) trains the denoiser's slots, not the encoder or predictor."""
    from dihal_fast.hcdlm.objective import hcdlm_loss

    torch.manual_seed(0)
    context, target = _batch(sudoku4, 4)
    cfg = ObjectiveConfig(
        lambda_recon=0, lambda_ent=0, lambda_cont=0, lambda_token=0, mask_aux_weight=0, slot_aux_weight=1.0
    )
    with pytest.raises(ValueError, match="slot head"):
        hcdlm_loss(
            HCDLM(sudoku4.spec, HCDLMModelConfig(**TINY, slot_head=False)),
            UniformKernel(4),
            context,
            target,
            cfg,
            torch.Generator().manual_seed(0),
        )
    model = HCDLM(sudoku4.spec, HCDLMModelConfig(**TINY, slot_head=True))
    loss, parts = hcdlm_loss(model, UniformKernel(4), context, target, cfg, torch.Generator().manual_seed(0))
    loss.backward()
    assert parts["loss"] == pytest.approx(parts["slot_aux"]) and parts["slot_aux"] > 0
    assert all(
        p.grad is None or float(p.grad.abs().sum()) == 0
        for p in [*model.encoder.parameters(), *model.predictor.parameters()]
    )
    assert float(model.denoiser.slot_head[1].weight.grad.abs().sum()) > 0


def test_without_the_slot_readout_x0_is_the_latent_tokens_output(sudoku4):
    """``slot_readout=False`` (the paper's denoiser): exactly the read-out-free path of the shortcut network."""
    context, target = _batch(sudoku4, 3)
    torch.manual_seed(0)
    ours = HCDLM(sudoku4.spec, HCDLMModelConfig(**TINY, slot_readout=True)).eval()
    paper = HCDLM(sudoku4.spec, HCDLMModelConfig(**TINY, slot_readout=False)).eval()
    missing, unexpected = paper.load_state_dict(ours.state_dict(), strict=False)
    assert not missing and unexpected and all(key.startswith("denoiser.readout.") for key in unexpected)
    assert count_parameters(ours) - count_parameters(paper) == count_parameters(ours.denoiser.readout)
    cfg = HCDLMModelConfig(**TINY)
    x_t, s = torch.randn(3, cfg.latents, cfg.latent_dim), torch.rand(3)
    with torch.no_grad():
        with_readout = ours.denoiser(x_t, target, s, context)
        for weight in ours.denoiser.readout.linear.parameters():
            weight.zero_()
        assert not torch.allclose(with_readout, ours.denoiser(x_t, target, s, context))
        assert torch.equal(paper.denoiser(x_t, target, s, context), ours.denoiser(x_t, target, s, context))


def test_cells_layout_gives_one_latent_per_slot(sudoku4):
    """``latent_layout="cells"``: M = L latents, each slot's own; every network trains through the loss, and a
    chain samples; any other M is refused where the model is built."""
    length = sudoku4.spec.target_len
    with pytest.raises(DihalValueError, match="--latents 16"):
        HCDLM(sudoku4.spec, HCDLMModelConfig(**TINY, latent_layout="cells", latents=3))
    cfg = HCDLMModelConfig(**TINY, latent_layout="cells", latents=length, slot_readout=False, slot_head=False)
    torch.manual_seed(0)
    model = HCDLM(sudoku4.spec, cfg)
    context, target = _batch(sudoku4, 4)
    mean, logvar = model.encoder(target, context)
    assert mean.shape == logvar.shape == (4, length, cfg.latent_dim)
    x_hat = model.denoiser(torch.randn(4, length, cfg.latent_dim), target, torch.rand(4), context)
    assert x_hat.shape == (4, length, cfg.latent_dim)
    assert model.predictor(x_hat, context).shape == (4, length, sudoku4.spec.target_vocab)
    objective, kernel = ObjectiveConfig(slot_aux_weight=0.0), make_kernel("uniform", sudoku4.spec.target_vocab)
    loss, _ = hcdlm_loss(model, kernel, context, target, objective, torch.Generator())
    loss.backward()
    for part in (model.encoder, model.denoiser, model.predictor):
        assert any(float(p.grad.abs().sum()) > 0 for p in part.parameters() if p.grad is not None)
    tokens = sample_hcdlm(model.eval(), kernel, context, SampleConfig(steps=4))
    assert tokens.shape == (4, length)


def test_token_term_matches_cross_entropy():
    """``all`` = mean CE; ``schedule`` = CE on the corrupted positions / s / L, averaged over the batch."""
    from dihal_fast.hcdlm.objective import token_term

    gen = torch.Generator().manual_seed(0)
    logits, target = torch.randn(3, 5, 4, generator=gen), torch.randint(4, (3, 5), generator=gen)
    hit, s = torch.rand(3, 5, generator=gen) < 0.5, torch.tensor([0.2, 0.5, 1.0])
    logp = torch.log_softmax(logits.double(), -1).gather(-1, target[..., None]).squeeze(-1)
    assert float(token_term(logits, target, hit, s, "all")) == pytest.approx(float(-logp.mean()), rel=1e-6)
    expected = float(((-logp * hit).sum(1) / s.double() / 5).mean())
    assert float(token_term(logits, target, hit, s, "schedule")) == pytest.approx(expected, rel=1e-6)


def test_entropy_term_sums_latent_dimensions():
    from dihal_fast.hcdlm.objective import LOG_2PI, gaussian_log_density

    logvar = torch.full((2, 3, 4), -1.0)
    assert float(gaussian_log_density(logvar)) == pytest.approx(-0.5 * 12 * (-1.0 + LOG_2PI + 1.0))
    assert float(gaussian_log_density(logvar, per=6)) == pytest.approx(-0.5 * 2 * (-1.0 + LOG_2PI + 1.0))


def test_ar_model_is_causal(sudoku4):
    torch.manual_seed(0)
    model = ARNet(sudoku4.spec, HCDLMModelConfig(**TINY), blocks=1).eval()
    context, target = _batch(sudoku4, 2)
    prefix = torch.cat([torch.full((2, 1), model.bos_id), target[:, :-1]], dim=1)
    changed = prefix.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % 4
    with torch.no_grad():
        assert torch.allclose(model(context, prefix)[:, :9], model(context, changed)[:, :9], atol=1e-5)


@pytest.mark.parametrize("which", ["sudoku", "countdown"])
def test_ar_cached_decoding_matches_the_full_pass(which, sudoku4):
    """Each decoding step with kept keys and values gives the full pass's last row (float64), and sample_ar's answers
    and log-likelihoods equal a decode that recomputes the prefix at every token."""
    torch.manual_seed(1)
    task = sudoku4 if which == "sudoku" else CountdownTask((3,), target_len=14)
    model = ARNet(task.spec, HCDLMModelConfig(**TINY), blocks=3).double().eval()
    context, _ = _batch(task, 5)
    prefix = torch.full((5, 1), model.bos_id)
    caches: list[list[torch.Tensor]] = [[] for _ in model.blocks]
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _ in range(task.spec.target_len):
            cached = model(context, prefix, caches)[:, -1]
            full = model(context, prefix)[:, -1]
            assert torch.allclose(cached, full, rtol=1e-10, atol=1e-10)
            token = torch.multinomial(torch.softmax(full, -1), 1, generator=generator)
            prefix = torch.cat([prefix, token], dim=1)
        log_prob = torch.zeros(5, dtype=torch.float64)
        answers = sample_ar(model, context, SampleConfig(temperature=1.0), torch.Generator().manual_seed(4), log_prob)
        prefix, expected = torch.full((5, 1), model.bos_id), torch.zeros(5, dtype=torch.float64)
        generator = torch.Generator().manual_seed(4)
        for _ in range(task.spec.target_len):
            logits = model(context, prefix)[:, -1:]
            token = sample_categorical(logits, 1.0, generator=generator)
            expected += answer_log_prob(logits, token)
            prefix = torch.cat([prefix, token], dim=1)
    assert torch.equal(answers, prefix[:, 1:])
    assert torch.allclose(log_prob, expected, rtol=1e-10)


def test_cached_block_takes_one_causal_position():
    with torch.no_grad(), pytest.raises(ValueError, match="one new position at a time on a causal block"):
        Block(8, 2)(torch.zeros(1, 3, 8), cache=[])  # not causal: nothing to keep
    block = Block(8, 2, causal=True)
    with torch.no_grad():
        block(torch.zeros(1, 3, 8), cache=(cache := []))
        with pytest.raises(ValueError, match="one new position at a time on a causal block, got 2"):
            block(torch.zeros(1, 2, 8), cache=cache)
        assert block(torch.zeros(1, 1, 8), cache=cache).shape == (1, 1, 8) and cache[0].shape[2] == 4


def test_sudoku_slot_groups_are_rows_columns_boxes():
    """Two cells share a row/column/box label exactly when the geometry puts them in that unit."""
    task = SudokuTask(2, 3)
    n = task.geo.n
    kinds = [task.geo.units[i * n : (i + 1) * n] for i in range(3)]  # rows, columns, boxes
    for labels, units in zip(task.spec.slot_groups, kinds):
        for a in range(task.geo.cells):
            for b in range(task.geo.cells):
                assert (labels[a] == labels[b]) == any(a in u and b in u for u in units)
    with pytest.raises(ValueError, match="slot labelling"):
        TaskSpec("bad", target_vocab=4, target_len=3, slot_groups=((0, 1),))


def test_slot_positions_share_group_vectors(sudoku4):
    positions = SlotPositions(sudoku4.spec, 8)
    with torch.no_grad():
        positions.free.zero_()
        positions.groups[1].weight.zero_()  # columns
        positions.groups[2].weight.zero_()  # boxes
        rows = positions()
    assert torch.equal(rows[0], rows[3]) and not torch.equal(rows[0], rows[4])  # cells 0 and 3 share row 0


def test_denoiser_reads_every_slot(sudoku4):
    """With the slot read-out (the shortcut design) x_hat_0 depends on the scaffold token at every position, from
    initialisation."""
    torch.manual_seed(0)
    model = HCDLM(sudoku4.spec, HCDLMModelConfig(**TINY, slot_readout=True))
    context, target = _batch(sudoku4, 1)
    x_t, s = torch.randn(1, 1, TINY["latent_dim"]), torch.tensor([0.5])
    base = model.denoiser(x_t, target, s, context)
    for cell in range(sudoku4.spec.target_len):
        changed = target.clone()
        changed[0, cell] = (changed[0, cell] + 1) % 4
        assert not torch.allclose(model.denoiser(x_t, changed, s, context), base)


def _token_only(**overrides) -> ObjectiveConfig:
    return ObjectiveConfig(
        lambda_recon=0, lambda_ent=0, lambda_cont=0, mask_aux_weight=0, slot_aux_weight=0, exposure_share=0, **overrides
    )


def _captured_denoiser_inputs(model):
    """Record the scaffold and x_hat_0 of every denoiser call."""
    seen = []
    model.denoiser.register_forward_hook(
        lambda module, args, out: seen.append((args[1], out[0] if isinstance(out, tuple) else out))
    )
    return seen


def test_dropped_scaffolds_count_as_level_one_in_the_schedule_token_term(sudoku4):
    """Regression (issue 23): with every scaffold dropped, 'schedule' weighting must score every position at
    level 1 (a mean CE), not 1/s times the positions the kernel had touched before the drop."""
    from torch.nn import functional as F

    torch.manual_seed(0)
    model = HCDLM(sudoku4.spec, HCDLMModelConfig(**TINY))
    context, target = _batch(sudoku4, 8)
    seen = _captured_denoiser_inputs(model)
    cfg = _token_only(token_weighting="schedule", guidance_training=True, scaffold_drop=1.0)
    _, parts = hcdlm_loss(model, UniformKernel(4), context, target, cfg, torch.Generator().manual_seed(0))
    x_hat = seen[-1][1]
    expected = F.cross_entropy(model.predictor(x_hat, context).transpose(1, 2), target).detach()
    assert parts["token"] == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize("guidance", [False, True])
def test_scaffolds_are_dropped_only_when_guidance_is_trained(sudoku4, guidance):
    """Absorbing kernel: a kernel draw holds only [MASK] and true tokens; dropped rows hold random tokens."""
    torch.manual_seed(0)
    model = HCDLM(sudoku4.spec, HCDLMModelConfig(kernel="absorbing", **TINY))
    context, target = _batch(sudoku4, 16)
    seen = _captured_denoiser_inputs(model)
    hcdlm_loss(
        model,
        AbsorbingKernel(4),
        context,
        target,
        _token_only(guidance_training=guidance, scaffold_drop=1.0),
        torch.Generator().manual_seed(0),
    )
    scaffold = seen[-1][0]
    kernel_draw = (scaffold == 4) | (scaffold == target)
    assert bool(kernel_draw.all()) != guidance
    if guidance:
        assert not bool((scaffold == 4).any())


def test_auto_token_weighting_is_the_papers_per_kernel(sudoku4):
    """auto = schedule for the absorbing kernel, all for the uniform one (same seed, same loss)."""
    context, target = _batch(sudoku4, 8)
    for kernel, paper in (("absorbing", "schedule"), ("uniform", "all")):
        losses = {}
        for weighting in ("auto", "all", "schedule"):
            torch.manual_seed(0)
            model = HCDLM(sudoku4.spec, HCDLMModelConfig(kernel=kernel, **TINY))
            losses[weighting] = hcdlm_loss(
                model,
                make_kernel(kernel, 4),
                context,
                target,
                _token_only(token_weighting=weighting),
                torch.Generator().manual_seed(1),
            )[1]["token"]
        assert losses["auto"] == losses[paper] and losses["all"] != losses["schedule"]


def test_soft_logvar_bound_has_a_gradient_everywhere(sudoku4):
    """soft: tanh-bounded in [logvar_min, 0], slope 1 in the middle, gradient beyond the ends; clamp: none there."""
    from dihal_fast.hcdlm.networks import LOGVAR_INIT

    soft = HCDLM(sudoku4.spec, HCDLMModelConfig(logvar_min=-6.0, **TINY)).encoder
    clamp = HCDLM(sudoku4.spec, HCDLMModelConfig(logvar_bound="clamp", logvar_min=-6.0, **TINY)).encoder
    raw = torch.tensor([-40.0, -8.0, -3.0, 2.0, 40.0], requires_grad=True)
    bounded = soft.bound_logvar(raw)
    assert bool((bounded >= -6.0).all()) and bool((bounded <= 0.0).all())
    grad = torch.autograd.grad(bounded[1:4].sum(), raw)[0]
    assert bool((grad[1:4] > 0).all()) and float(grad[2]) == pytest.approx(1.0)
    assert float(torch.autograd.grad(clamp.bound_logvar(raw)[1], raw)[0][1]) == 0.0
    context, target = _batch(sudoku4, 4)
    for encoder in (soft, clamp):  # both start at LOGVAR_INIT
        assert torch.allclose(encoder(target, context)[1].mean(), torch.tensor(LOGVAR_INIT), atol=0.3)
    assert bool(torch.isfinite(soft.bound_logvar(torch.linspace(-1e3, 1e3, 2001))).all())


def test_exposure_share_ramps_from_zero(sudoku4, monkeypatch):
    from dihal_fast.hcdlm import objective
    from dihal_fast.hcdlm.trainer import RunObjective

    cfg = ObjectiveConfig(exposure_share=0.5, exposure_ramp_steps=100)
    assert [cfg.exposure_at(s) for s in (0, 50, 100, 1000)] == [0.0, 0.25, 0.5, 0.5]
    assert ObjectiveConfig(exposure_share=0.5).exposure_at(0) == 0.5
    calls = []
    original = objective.own_prediction_inputs
    monkeypatch.setattr(objective, "own_prediction_inputs", lambda *a: (calls.append(1), original(*a))[1])
    torch.manual_seed(0)
    run = RunObjective(
        HCDLM(sudoku4.spec, HCDLMModelConfig(**TINY)),
        UniformKernel(4),
        ObjectiveConfig(exposure_share=1.0, exposure_ramp_steps=100),
    )
    context, target = _batch(sudoku4, 8)
    run(context, target, torch.Generator().manual_seed(0), step=0)
    assert not calls
    run(context, target, torch.Generator().manual_seed(0), step=100)
    assert calls
