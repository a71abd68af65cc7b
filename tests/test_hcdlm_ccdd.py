"""CCDD (the joint token + embedding chain baseline): shapes, the parameter budget, the objective, the sampler,
checkpoints and the ``dihal hcdlm`` CLI on tiny 4x4 Sudoku runs."""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from dihal_fast.cli import main
from dihal_fast.hcdlm.ccdd import CCDDNet, ccdd_loss, sample_ccdd, token_code
from dihal_fast.hcdlm.config import HCDLMModelConfig, ObjectiveConfig, RunConfig, SampleConfig
from dihal_fast.hcdlm.layers import count_parameters
from dihal_fast.hcdlm.models import build_model, generate, matched_blocks
from dihal_fast.hcdlm.noise import make_kernel
from dihal_fast.hcdlm.scoring import load_run
from dihal_fast.hcdlm.trainer import train
from dihal_fast.tasks.countdown_task import CountdownTask
from dihal_fast.tasks.sudoku_task import SudokuTask, generate_pool
from dihal_fast.testing.tiny import HCDLM_TINY, HCDLM_TINY_ARGS, hcdlm_text_args, hcdlm_tiny_config
from dihal_fast.train.checkpoint import latest_checkpoint


@pytest.fixture(scope="module")
def sudoku4():
    task = SudokuTask(2, 2)
    task.pool = generate_pool(task.geo, 40, "singles", seed=0)
    return task


def _ccdd(task, **fields) -> CCDDNet:
    model = build_model(task.spec, HCDLMModelConfig(kind="ccdd", **{**HCDLM_TINY, **fields}))
    assert isinstance(model, CCDDNet)
    return model


@pytest.mark.parametrize("which", ["sudoku", "countdown"])
def test_shapes_loss_and_sampling(which, sudoku4):
    torch.manual_seed(0)
    task = sudoku4 if which == "sudoku" else CountdownTask((3,), target_len=14)
    model = _ccdd(task).eval()
    context, target = task.train_batch(random.Random(0), 5)
    length, vocab, dim = task.spec.target_len, task.spec.target_vocab, HCDLM_TINY["latent_dim"]
    logits, z_hat = model(torch.randn(5, length, dim), target, torch.rand(5), context)
    assert logits.shape == (5, length, vocab) and z_hat.shape == (5, length, dim)
    loss, parts = ccdd_loss(model, context, target, ObjectiveConfig(), torch.Generator().manual_seed(0))
    assert loss.dim() == 0 and torch.isfinite(loss) and parts["loss"] == pytest.approx(loss.item())
    assert parts["loss"] == pytest.approx(parts["token"] + ObjectiveConfig().lambda_cont * parts["cont"], rel=1e-5)
    out = generate(model, make_kernel("uniform", vocab), context, SampleConfig(steps=3), torch.Generator())
    assert out.shape == target.shape and out.dtype == torch.long
    assert int(out.min()) >= 0 and int(out.max()) < vocab  # every slot revealed, no [MASK] left


def test_the_token_code_is_fixed_normalised_and_not_a_parameter(sudoku4):
    a, b = _ccdd(sudoku4), _ccdd(sudoku4, hidden=64, heads=4)
    assert torch.equal(a.code, b.code) and torch.equal(a.code, token_code(4, HCDLM_TINY["latent_dim"]))
    assert torch.allclose(a.code.mean(-1), torch.zeros(4), atol=1e-5)
    assert torch.allclose(a.code.var(-1, unbiased=False), torch.ones(4), atol=1e-3)
    assert "code" not in a.state_dict() and all("code" not in name for name, _ in a.named_parameters())
    assert torch.equal(a.embed(torch.tensor([[2, 0]])), a.code[[2, 0]][None])


@pytest.mark.parametrize("box", [(2, 2), (2, 3), (3, 3)])
def test_ccdd_matches_the_hcdlm_parameter_budget(box):
    """baseline_blocks=0: as many blocks as come closest to HC-DLM's count (within half a block), as MDM/AR."""
    task = SudokuTask(*box)
    budget = count_parameters(build_model(task.spec, HCDLMModelConfig(hidden=64, heads=4)))
    cfg = HCDLMModelConfig(kind="ccdd", hidden=64, heads=4)
    blocks = matched_blocks(task.spec, cfg, "ccdd")
    count = count_parameters(build_model(task.spec, cfg))
    per_block = (count - count_parameters(CCDDNet(task.spec, cfg, 0))) / blocks
    assert abs(count - budget) <= per_block / 2 and abs(count - budget) < 0.1 * budget
    assert count_parameters(build_model(task.spec, HCDLMModelConfig(kind="ccdd", baseline_blocks=2))) < count


def test_objective_decreases_on_a_tiny_board(sudoku4):
    torch.manual_seed(0)
    model = _ccdd(sudoku4)
    context, target = sudoku4.train_batch(random.Random(0), 16)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses, conts = [], []
    for step in range(40):
        loss, parts = ccdd_loss(model, context, target, ObjectiveConfig(), torch.Generator().manual_seed(step % 4))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        conts.append(parts["cont"])
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-8:]) / 8 < 0.85 * sum(losses[:8]) / 8
    assert sum(conts[-8:]) / 8 < sum(conts[:8]) / 8  # the embedding chain is learned too


def _loss_inputs(model: CCDDNet, context, target, seed: int) -> list[tuple[torch.Tensor, ...]]:
    """Every ``(z_t, tokens, s)`` the objective hands the network, in call order."""
    calls: list[tuple[torch.Tensor, ...]] = []
    hook = model.register_forward_pre_hook(lambda _, args: calls.append(tuple(a.clone() for a in args[:3])))
    try:
        ccdd_loss(model, context, target, ObjectiveConfig(), torch.Generator().manual_seed(seed))
    finally:
        hook.remove()
    return calls


@pytest.mark.parametrize("seed", range(4))
def test_no_masked_slot_sees_anything_of_its_true_token(sudoku4, seed):
    """Change the true tokens at the slots the objective masks: every input the network gets (both chains, every
    pass) stays bit for bit the same, so the token head cannot read the answer from the embedding chain."""
    torch.manual_seed(0)
    model = _ccdd(sudoku4)
    context, target = sudoku4.train_batch(random.Random(seed), 8)
    calls = _loss_inputs(model, context, target, seed)
    masked = calls[-1][1] == model.mask_id  # the slots the scored pass hides
    assert bool(masked.any())
    changed = torch.where(masked, (target + 1) % sudoku4.spec.target_vocab, target)
    again = _loss_inputs(model, context, changed, seed)
    assert len(again) == len(calls)
    for before, after in zip(calls, again):
        assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_the_objective_reaches_both_chains(sudoku4):
    """The token term reads z_t and the regression reads k_t: each chain conditions the other's prediction."""
    torch.manual_seed(0)
    model = _ccdd(sudoku4).eval()
    for block in model.blocks:  # adaLN-Zero starts every block as the identity: open them
        torch.nn.init.normal_(block.modulation.weight, std=0.2)
    context, target = sudoku4.train_batch(random.Random(1), 4)
    s, z = torch.full((4,), 0.5), torch.randn(4, 16, HCDLM_TINY["latent_dim"])
    masked = target.masked_fill(torch.rand(target.shape) < 0.5, model.mask_id)
    logits, z_hat = model(z, masked, s, context)
    logits_z, _ = model(torch.randn_like(z), masked, s, context)
    _, z_hat_k = model(z, target, s, context)
    assert not torch.allclose(logits, logits_z) and not torch.allclose(z_hat, z_hat_k)


def test_sampling_is_deterministic_with_a_seed_and_keeps_revealed_tokens(sudoku4):
    torch.manual_seed(0)
    model = _ccdd(sudoku4).eval()
    context, _ = sudoku4.train_batch(random.Random(2), 6)
    cfg = SampleConfig(steps=4, temperature=1.0)
    trace: list[torch.Tensor] = []
    first = sample_ccdd(model, context, cfg, torch.Generator().manual_seed(3), on_step=lambda i, t: trace.append(t))
    again = sample_ccdd(model, context, cfg, torch.Generator().manual_seed(3))
    assert torch.equal(first, again) and len(trace) == 4 and torch.equal(trace[-1], first)
    other = [sample_ccdd(model, context, cfg, torch.Generator().manual_seed(seed)) for seed in range(4, 8)]
    assert any(not torch.equal(first, o) for o in other)  # temperature 1 draws depend on the seed


def test_each_step_reveals_on_schedule_and_revealed_tokens_stay(sudoku4, monkeypatch):
    """The token chain is MDM's: round(L (N - i) / N) slots stay masked after step i, a revealed slot never changes;
    the embedding chain takes the x0-prediction Euler step every step."""
    import dihal_fast.hcdlm.ccdd as ccdd

    torch.manual_seed(0)
    model = _ccdd(sudoku4).eval()
    context, _ = sudoku4.train_batch(random.Random(2), 6)
    states: list[torch.Tensor] = []
    reveal, euler = ccdd.reveal_confident, ccdd.LATENT_FLOW.euler_step
    monkeypatch.setattr(ccdd, "reveal_confident", lambda *a: states.append(reveal(*a)) or states[-1])
    steps_seen: list[int] = []
    monkeypatch.setattr(ccdd.LATENT_FLOW, "euler_step", lambda z, x, t: steps_seen.append(t) or euler(z, x, t))
    steps = 5
    tokens = sample_ccdd(model, context, SampleConfig(steps=steps, order="prob"), torch.Generator().manual_seed(0))
    assert steps_seen == [5, 4, 3, 2, 1] and torch.equal(states[-1], tokens)
    previous = torch.full_like(tokens, model.mask_id)
    for i, state in enumerate(states, start=1):
        masked = state == model.mask_id
        assert (masked.sum(1) == round(16 * (steps - i) / steps)).all()
        kept = previous != model.mask_id
        assert torch.equal(state[kept], previous[kept])
        previous = state


def test_hcdlm_sampler_options_are_refused_in_one_line(sudoku4):
    model = _ccdd(sudoku4).eval()
    context, _ = sudoku4.train_batch(random.Random(0), 2)
    for cfg in (SampleConfig(steps=2, cfg_weight=2.0), SampleConfig(steps=2, clamp=True)):
        with pytest.raises(ValueError, match="the ccdd sampler never reads --(cfg-weight 2.0|clamp)") as info:
            generate(model, make_kernel("uniform", 4), context, cfg)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "cdd"}, "--model must be one of .*ccdd"),
        ({"kind": "ccdd", "baseline_blocks": -1}, "--baseline-blocks"),
    ],
)
def test_bad_model_options_are_refused_in_one_line(fields, message):
    with pytest.raises(ValueError, match=message) as info:
        HCDLMModelConfig(**fields)
    assert "\n" not in str(info.value)


def _config(steps: int) -> RunConfig:
    return hcdlm_tiny_config(steps, model={"kind": "ccdd"}, log_every=1, checkpoint_every=3, warmup_steps=2)


def test_resume_gives_the_same_weights_and_load_the_same_model(tmp_path):
    train(_config(6), tmp_path / "straight")
    train(_config(3), tmp_path / "resumed")
    train(_config(6), tmp_path / "resumed")
    for name in ("weights.safetensors", "ema.safetensors", "stream.safetensors"):
        a = load_file(latest_checkpoint(tmp_path / "straight") / name)
        b = load_file(latest_checkpoint(tmp_path / "resumed") / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    log = [json.loads(line) for line in (tmp_path / "resumed" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6] and {"token", "cont"} <= set(log[-1])
    assert RunConfig.load(latest_checkpoint(tmp_path / "resumed") / "config.json") == _config(6)
    run = load_run(tmp_path / "resumed", use_ema=False)
    raw = load_file(latest_checkpoint(tmp_path / "resumed") / "weights.safetensors")
    state = run.model.state_dict()
    assert isinstance(run.model, CCDDNet) and all(torch.equal(state[k[len("model.") :]], v) for k, v in raw.items())
    from dihal_fast.tasks.sudoku import parse_grid, solve_all

    puzzle = parse_grid("1.3..2.1..2.....", run.task.geo)
    context = torch.tensor([run.task.example(puzzle, solve_all(puzzle, run.task.geo, limit=1)[0], "x").context])
    cfg = SampleConfig(steps=3, temperature=1.0)
    draws = [generate(run.model, run.kernel, context, cfg, torch.Generator().manual_seed(5)) for _ in range(2)]
    assert torch.equal(draws[0], draws[1])


def test_cli_train_eval_solve(tmp_path, capsys):
    run = tmp_path / "ccdd"
    args = ["hcdlm", "train", "--task", "sudoku", "--sudoku-box", "2x2", "--sudoku-pool", "20", "--model", "ccdd"]
    assert main([*args, "--out", str(run), "--steps", "2", *HCDLM_TINY_ARGS]) == 0
    assert "trained ccdd on sudoku: step 2" in capsys.readouterr().out
    assert main(["hcdlm", "solve", str(run), "1.3..2.1..2.....", "--steps", "2"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("check:")
    from dihal_fast.tasks.sudoku import geometry, parse_grid, solve_all

    puzzle = parse_grid("1.3..2.1..2.....", geometry(2, 2))
    (grid,) = solve_all(puzzle, geometry(2, 2), limit=1)
    csv = tmp_path / "one.csv"
    csv.write_text(f"puzzle,solution\n{''.join(map(str, puzzle))},{''.join(map(str, grid))}\n")
    out = tmp_path / "eval.json"
    assert main(["hcdlm", "eval", str(run), "--data", str(csv), "--out", str(out), "--steps", "3"]) == 0
    report = json.loads(out.read_text())
    assert report["model"] == "ccdd" and report["n"] == 1 and "oracle_ablations" not in report  # no latent to ablate
    assert "interventions" not in report
    assert [row["fraction"] for row in report["trajectory"]["ccdd"]] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert [row["steps"] for row in report["accuracy_vs_steps"]] == [3, 5, 10, 25, 50]
    capsys.readouterr()
    assert main(["hcdlm", "eval", str(run), "--data", str(csv), "--out", str(out), "--cfg-weight", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the ccdd sampler never reads --cfg-weight 2.0" in err[0]


def test_cli_countdown_train_and_eval(tmp_path, shared_data):
    run, out = tmp_path / "cd", tmp_path / "cd.json"
    train_args = ["hcdlm", "train", "--task", "countdown", "--model", "ccdd", "--out", str(run), "--steps", "2"]
    assert main([*train_args, *HCDLM_TINY_ARGS]) == 0
    data = str(shared_data / "countdown.jsonl")
    eval_args = ["--limit", "4", "--steps", "2", "--steps-sweep", ""]
    assert main(["hcdlm", "eval", str(run), "--data", data, "--out", str(out), *eval_args]) == 0
    report = json.loads(out.read_text())
    assert report["model"] == "ccdd" and report["n"] == 4 and {"accuracy", "loose"} <= set(report)


def test_cli_text_with_tiny_backbone(tmp_path, tiny_checkpoints, shared_data):
    backbone, text = tiny_checkpoints["llama"], shared_data / "text" / "tinystories.valid.txt"
    run, out = tmp_path / "text", tmp_path / "text.json"
    train_args = ["hcdlm", "train", "--task", "text", "--model", "ccdd", "--out", str(run), "--steps", "2"]
    assert main([*train_args, *hcdlm_text_args(text, backbone), *HCDLM_TINY_ARGS]) == 0
    eval_args = ["--samples", "4", "--steps", "2", "--evaluator", str(backbone)]
    assert main(["hcdlm", "eval", str(run), "--data", str(text), "--out", str(out), *eval_args]) == 0
    report = json.loads(out.read_text())
    assert report["model"] == "ccdd" and report["gen_ppl"] > 1 and report["temperature"] == 1.0
