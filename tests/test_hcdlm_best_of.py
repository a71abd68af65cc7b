"""Best-of-K sampling (``SampleConfig.best_of``): each sampler's answer log-probability against a float64
reference, the chain chosen per problem, one-chain sampling unchanged, refusals where chains cannot differ, each kind's
default diversity source, and ``dihal hcdlm eval --best-of K`` reporting one chain, best-of-K and oracle@K."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dihal_fast.hcdlm.ccdd import sample_ccdd
from dihal_fast.hcdlm.config import HCDLMModelConfig, SampleConfig
from dihal_fast.hcdlm.models import build_model, generate, kind_of
from dihal_fast.hcdlm.noise import make_kernel
from dihal_fast.hcdlm.sampler import answer_log_prob, sample_ar, sample_hcdlm, sample_mdm
from dihal_fast.tasks.sudoku_task import SudokuTask, generate_pool
from dihal_fast.testing.tiny import HCDLM_TINY, hcdlm_tiny_config


@pytest.fixture(scope="module")
def sudoku4():
    task = SudokuTask(2, 2)
    task.pool = generate_pool(task.geo, 20, "singles", seed=0)
    return task


def _model(task, kind: str):
    torch.manual_seed(0)
    return build_model(task.spec, HCDLMModelConfig(kind=kind, latents=2, **HCDLM_TINY)).eval()


def _context(task, n: int = 5) -> torch.Tensor:
    return task.train_batch(random.Random(0), n)[0]


def _reference_log_prob(logits: np.ndarray, tokens: np.ndarray, where: np.ndarray | None) -> np.ndarray:
    """float64 NumPy: sum over positions of log softmax(logits)[token]."""
    z = logits - logits.max(-1, keepdims=True)
    log_softmax = z - np.log(np.exp(z).sum(-1, keepdims=True))
    chosen = np.take_along_axis(log_softmax, tokens[..., None], -1)[..., 0]
    return (chosen if where is None else chosen * where).sum(1)


@settings(max_examples=30, deadline=None)
@given(
    batch=st.integers(1, 4),
    length=st.integers(1, 9),
    vocab=st.integers(2, 11),
    scale=st.sampled_from([1e-3, 1.0, 50.0]),
    masked=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_answer_log_prob_matches_float64_reference(batch, length, vocab, scale, masked, seed):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((batch, length, vocab)).astype(np.float32) * scale
    tokens = rng.integers(0, vocab, (batch, length))
    where = rng.random((batch, length)) < 0.5 if masked else None
    got = answer_log_prob(
        torch.from_numpy(logits), torch.from_numpy(tokens), None if where is None else torch.from_numpy(where)
    )
    assert got.dtype == torch.float64 and got.shape == (batch,)
    expected = _reference_log_prob(logits.astype(np.float64), tokens, where)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_hcdlm_log_prob_is_the_final_readout(sudoku4):
    """HC-DLM's score is log p(k0 | x_0) of the answer read from the latent the chain ends on."""
    model, kernel, context = _model(sudoku4, "hcdlm"), make_kernel("uniform", 4), _context(sudoku4)
    finals: list[torch.Tensor] = []
    log_prob = torch.zeros(context.shape[0], dtype=torch.float64)
    tokens = sample_hcdlm(
        model,
        kernel,
        context,
        SampleConfig(steps=3),
        torch.Generator().manual_seed(2),
        on_step=lambda t, x, x_hat, *_: finals.append(x_hat),
        log_prob=log_prob,
    )
    with torch.no_grad():  # the last step's x_hat_0 is the final latent, up to the float32 Euler step's rounding
        logits = model.predictor(finals[-1], context).double()
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1).sum(1)
    assert torch.allclose(log_prob, expected, rtol=1e-5, atol=1e-5)


def test_mdm_log_prob_sums_each_token_at_its_reveal(sudoku4, monkeypatch):
    model, context = _model(sudoku4, "mdm"), _context(sudoku4)
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []  # (tokens in, logits out) of every forward pass
    forward = model.forward
    monkeypatch.setattr(
        model, "forward", lambda tokens, ctx: calls.append((tokens, forward(tokens, ctx))) or calls[-1][1]
    )
    log_prob = torch.zeros(context.shape[0], dtype=torch.float64)
    tokens = sample_mdm(
        model, context, SampleConfig(steps=5, temperature=1.0), torch.Generator().manual_seed(4), log_prob=log_prob
    )
    states = [state for state, _ in calls] + [tokens]
    expected = torch.zeros_like(log_prob)
    for (before, logits), after in zip(calls, states[1:]):
        revealed = (before == model.mask_id) & (after != model.mask_id)
        chosen = torch.log_softmax(logits.double(), -1).gather(-1, tokens[..., None]).squeeze(-1)
        expected += (chosen * revealed).sum(1)
    assert bool((tokens != model.mask_id).all())
    assert torch.allclose(log_prob, expected, rtol=1e-10, atol=1e-10)


def test_ar_log_prob_is_the_teacher_forced_likelihood(sudoku4):
    model, context = _model(sudoku4, "ar"), _context(sudoku4)
    log_prob = torch.zeros(context.shape[0], dtype=torch.float64)
    tokens = sample_ar(
        model, context, SampleConfig(temperature=1.0), torch.Generator().manual_seed(6), log_prob=log_prob
    )
    bos = torch.full((context.shape[0], 1), model.bos_id, dtype=torch.long)
    logits = model(context, torch.cat([bos, tokens[:, :-1]], dim=1)).double()
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1).sum(1)
    assert torch.allclose(log_prob, expected, rtol=1e-6, atol=1e-6)


def test_ccdd_log_prob_is_finite_and_at_most_zero(sudoku4):
    model, context = _model(sudoku4, "ccdd"), _context(sudoku4)
    log_prob = torch.zeros(context.shape[0], dtype=torch.float64)
    sample_ccdd(model, context, SampleConfig(steps=4), torch.Generator().manual_seed(1), log_prob=log_prob)
    assert bool(torch.isfinite(log_prob).all()) and bool((log_prob < 0).all())


@pytest.mark.parametrize(
    ("kind", "temperature"), [("hcdlm", 0.0), ("latent", 0.0), ("mdm", 1.0), ("ar", 1.0), ("ccdd", 0.0)]
)
def test_best_of_returns_the_most_likely_chain_per_problem(sudoku4, kind, temperature):
    """The K chains are the rows of one batch of B * K (problem-major); the answer is each problem's chain with the
    highest log-probability."""
    model, kernel, context = _model(sudoku4, kind), make_kernel("uniform", 4), _context(sudoku4)
    k, cfg = 3, SampleConfig(steps=3, temperature=temperature)
    log_prob = torch.zeros(context.shape[0] * k, dtype=torch.float64)
    chains = (
        kind_of(model)
        .sample(model, kernel, context.repeat_interleave(k, 0), cfg, torch.Generator().manual_seed(9), log_prob)
        .view(context.shape[0], k, -1)
    )
    expected = chains[torch.arange(context.shape[0]), log_prob.view(-1, k).argmax(1)]
    got = generate(
        model,
        kernel,
        context,
        SampleConfig(steps=3, temperature=temperature, best_of=k),
        torch.Generator().manual_seed(9),
    )
    assert torch.equal(got, expected)
    assert len({tuple(c) for c in chains.flatten(0, 1).tolist()}) > 1  # the chains do differ


def test_best_of_one_is_the_single_chain_bit_for_bit(sudoku4):
    model, kernel, context = _model(sudoku4, "hcdlm"), make_kernel("uniform", 4), _context(sudoku4)
    single = sample_hcdlm(model, kernel, context, SampleConfig(steps=4), torch.Generator().manual_seed(3))
    assert torch.equal(
        generate(model, kernel, context, SampleConfig(steps=4), torch.Generator().manual_seed(3)), single
    )


@pytest.mark.parametrize("kind", ["mdm", "ar"])
def test_deterministic_samplers_refuse_best_of(sudoku4, kind):
    model, context = _model(sudoku4, kind), _context(sudoku4)
    with pytest.raises(ValueError, match="--best-of 2 needs chains that differ"):
        generate(model, None, context, SampleConfig(steps=2, best_of=2))


@pytest.mark.parametrize("kind", ["hcdlm", "latent", "mdm", "ccdd", "ar"])
def test_each_kinds_default_diversity_source_makes_argmax_chains_differ(sudoku4, kind):
    """``protocol.best_of_config`` over an argmax config: the kind's default source (the first of its protocol
    candidates), accepted by the front door, and its K chains per problem not all the same."""
    from dihal_fast.hcdlm.models import sample_chains
    from dihal_fast.hcdlm.protocol import best_of_config, diverse_candidates

    model, kernel, context = _model(sudoku4, kind), make_kernel("uniform", 4), _context(sudoku4)
    cfg = best_of_config(model, SampleConfig(steps=3), 4)
    assert cfg == diverse_candidates(model, SampleConfig(steps=3), 4)[0] and cfg.best_of == 4
    generate(model, kernel, context, cfg, torch.Generator().manual_seed(0))  # not refused
    rows = context.repeat_interleave(4, 0)
    chains = sample_chains(model, kernel, rows, cfg, torch.Generator().manual_seed(0))[0].view(-1, 4, 16)
    assert any(len({tuple(c) for c in problem.tolist()}) > 1 for problem in chains)
    given = SampleConfig(steps=3, temperature=0.7)  # a source of the user's own is kept
    assert best_of_config(model, given, 4) == SampleConfig(steps=3, temperature=0.7, best_of=4)


def test_best_of_must_be_positive():
    with pytest.raises(ValueError, match="best_of"):
        SampleConfig(best_of=0)


def _tiny_run(tmp_path, kind: str):
    from dihal_fast.hcdlm.trainer import train

    config = hcdlm_tiny_config(
        model={"kind": kind, "slot_head": False}, objective={"slot_aux_weight": 0.0}, warmup_steps=1
    )
    train(config, tmp_path / kind)
    return tmp_path / kind


def test_solve_with_best_of_on_the_command_line(tmp_path, capsys):
    from dihal_fast.cli import main

    run = _tiny_run(tmp_path, "hcdlm")
    assert main(["hcdlm", "solve", str(run), "1... .... .... ...4", "--best-of", "3", "--steps", "2"]) == 0
    assert capsys.readouterr().out.strip()


def _puzzles(tmp_path):
    data = tmp_path / "p.csv"
    data.write_text("puzzle,solution\n1...........4...,1234341221434321\n.2.......1.....1,1234341221434321\n")
    return data


_QUICK = ["--steps", "2", "--steps-sweep", "", "--no-diagnostics"]


@pytest.mark.parametrize("kind", ["hcdlm", "latent", "mdm", "ccdd", "ar"])
def test_eval_best_of_reports_one_chain_best_of_and_oracle_for_every_kind(tmp_path, capsys, kind):
    """``eval --best-of K`` at the default (argmax) temperature: no kind is refused; each draws its K chains from its
    own default diversity source (the first of ``protocol.DIVERSITY``, as the protocol's candidates) and the report
    holds the protocol's three rows, the top-level accuracy being the single chain's."""
    import json

    from dihal_fast.cli import main
    from dihal_fast.hcdlm import protocol

    run, out = _tiny_run(tmp_path, kind), tmp_path / "eval.json"
    argv = ["hcdlm", "eval", str(run), "--data", str(_puzzles(tmp_path)), "--out", str(out), *_QUICK]
    assert main([*argv, "--best-of", "3"]) == 0
    printed = capsys.readouterr().out
    assert "best_of  K=3" in printed and "oracle   K=3" in printed
    report = json.loads(out.read_text())
    single, best, oracle = report["best_of"]["rows"]
    assert [r["mode"] for r in (single, best, oracle)] == ["single", "best_of", "oracle"] and report["best_of"][
        "k"
    ] == 3
    default = protocol.DIVERSITY[kind][0]
    assert {name: best["settings"][name] for name in default} == default and best["settings"]["best_of"] == 3
    assert single["settings"]["best_of"] == 1 and single["accuracy"] == report["accuracy"]
    assert best["settings"]["verifier"] == "chain" and oracle["accuracy"] >= best["accuracy"]
    assert single["settings"]["temperature"] == 0.0 and single["settings"]["reveal_noise"] == 0.0


def test_eval_best_of_keeps_a_given_diversity_source_and_verifier(tmp_path):
    import json

    from dihal_fast.cli import main

    run, out = _tiny_run(tmp_path, "mdm"), tmp_path / "eval.json"
    argv = ["hcdlm", "eval", str(run), "--data", str(_puzzles(tmp_path)), "--out", str(out), *_QUICK]
    assert main([*argv, "--best-of", "2", "--temperature", "1.0", "--verifier", "rules"]) == 0
    single, best, _ = json.loads(out.read_text())["best_of"]["rows"]
    assert (best["settings"]["temperature"], best["settings"]["reveal_noise"]) == (1.0, 0.0)
    assert best["settings"]["verifier"] == "rules" and single["settings"]["temperature"] == 1.0


def test_eval_best_of_scores_a_compare_run_the_same_way(tmp_path, capsys):
    import json

    from dihal_fast.cli import main

    run, other = _tiny_run(tmp_path, "hcdlm"), _tiny_run(tmp_path, "mdm")
    out = tmp_path / "e.json"
    argv = ["hcdlm", "eval", str(run), "--data", str(_puzzles(tmp_path)), "--out", str(out), *_QUICK]
    assert main([*argv, "--best-of", "2", "--compare", str(other)]) == 0
    report = json.loads(out.read_text())
    assert report["best_of"]["rows"][1]["settings"]["temperature"] == 0.0
    compared = report["compare"]["best_of"]["rows"]
    assert [r["mode"] for r in compared] == ["single", "best_of", "oracle"]
    assert compared[1]["settings"]["reveal_noise"] == 0.1 and compared[0]["accuracy"] == report["compare"]["accuracy"]


def test_the_removed_final_verifier_is_one_line_before_sampling(tmp_path, capsys, monkeypatch):
    from dihal_fast.cli import main
    from dihal_fast.hcdlm import scoring

    run, out = _tiny_run(tmp_path, "mdm"), tmp_path / "eval.json"
    capsys.readouterr()
    monkeypatch.setattr(scoring, "generate", lambda *a, **k: pytest.fail("sampled before refusing"))
    argv = ["hcdlm", "eval", str(run), "--data", str(_puzzles(tmp_path)), "--out", str(out), "--best-of", "2"]
    assert main([*argv, "--verifier", "final"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--verifier final was removed" in err and "--verifier rules" in err and len(err.splitlines()) == 1
    assert not out.exists()
