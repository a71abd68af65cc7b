"""The table of model kinds (:mod:`dihal_fast.hcdlm.models`): every kind registered once, best-of-K by each verifier,
MDM's givens and reveal-order noise, the pass counter, and the evaluation protocol (:mod:`dihal_fast.hcdlm.protocol`)
through ``dihal hcdlm eval --protocol-k``."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from functools import partial

import pytest
import torch
from torch import nn

from dihal_fast.errors import DihalValueError
from dihal_fast.hcdlm import models, protocol
from dihal_fast.hcdlm.config import (
    MODEL_KINDS,
    UNREAD_FIELDS,
    VERIFIERS,
    HCDLMModelConfig,
    ObjectiveConfig,
    RunConfig,
    SampleConfig,
)
from dihal_fast.hcdlm.eval_data import examples_from_file
from dihal_fast.hcdlm.models import (
    KINDS,
    PassCounter,
    build_model,
    choose,
    generate,
    kind_of,
    sample_chains,
    verify_chains,
)
from dihal_fast.hcdlm.noise import make_kernel
from dihal_fast.hcdlm.protocol import protocol_choice
from dihal_fast.hcdlm.sampler import sample_mdm
from dihal_fast.hcdlm.scoring import load_run
from dihal_fast.hcdlm.trainer import RunObjective
from dihal_fast.tasks.sudoku_splits import fresh_puzzles
from dihal_fast.tasks.sudoku_task import SudokuTask, generate_pool
from dihal_fast.testing.cli import error_line, run_cli
from dihal_fast.testing.tiny import HCDLM_TINY, hcdlm_tiny_config


@pytest.fixture(scope="module")
def sudoku4():
    task = SudokuTask(2, 2)
    task.pool = generate_pool(task.geo, 20, "singles", seed=0)
    return task


def _model(task, kind: str, **fields) -> nn.Module:
    torch.manual_seed(0)
    return build_model(task.spec, HCDLMModelConfig(kind=kind, **{**HCDLM_TINY, **fields})).eval()


def _context(task, n: int = 5) -> torch.Tensor:
    return task.train_batch(random.Random(1), n)[0]


def test_every_kind_is_registered_once_and_knows_its_network(sudoku4):
    assert set(KINDS) == set(MODEL_KINDS)
    for kind in MODEL_KINDS:
        assert kind_of(_model(sudoku4, kind)) is KINDS[kind]
    with pytest.raises(TypeError, match="no model kind for Linear"):
        kind_of(nn.Linear(2, 2))


def test_mdm_with_givens_keeps_them_and_reveals_the_blanks_on_schedule(sudoku4, monkeypatch):
    from dihal_fast.hcdlm import sampler

    model, context, steps = _model(sudoku4, "mdm"), _context(sudoku4), 4
    revealed: list[torch.Tensor] = []
    real = sampler.reveal_confident
    monkeypatch.setattr(sampler, "reveal_confident", lambda *args: revealed.append(real(*args)) or revealed[-1])
    out = sample_mdm(model, context, SampleConfig(steps=steps, givens=True))
    given = context > 0
    assert torch.equal(out[given], (context - 1)[given])  # the givens stay as given
    blanks = (~given).sum(1)
    assert len(revealed) == steps
    for i, state in enumerate(revealed, start=1):  # round(b (N - i) / N) of a row's b blanks still masked
        masked = (state == model.mask_id).sum(1)
        assert torch.equal(masked, torch.round(blanks.double() * (steps - i) / steps).long())


def test_reveal_noise_makes_argmax_mdm_chains_differ_and_is_refused_elsewhere(sudoku4):
    model, context = _model(sudoku4, "mdm"), _context(sudoku4)
    with pytest.raises(ValueError, match="needs chains that differ"):
        generate(model, None, context, SampleConfig(steps=4, best_of=3))
    cfg = SampleConfig(steps=4, best_of=3, reveal_noise=0.3)
    rows = context.repeat_interleave(3, 0)
    chains, _ = sample_chains(model, None, rows, cfg, torch.Generator().manual_seed(0))
    assert len({tuple(c) for c in chains.tolist()}) > context.shape[0]  # some problem got different chains
    for kind in ("hcdlm", "ar"):
        for bad in (SampleConfig(reveal_noise=0.1), SampleConfig(givens=True)):
            with pytest.raises(ValueError, match=f"the {kind} sampler never reads --(reveal-noise 0.1|givens)"):
                generate(_model(sudoku4, kind), make_kernel("uniform", 4), context, bad)


@pytest.mark.parametrize("verifier", VERIFIERS)
def test_best_of_picks_the_chain_its_verifier_scores_highest(sudoku4, verifier):
    model, context = _model(sudoku4, "mdm"), _context(sudoku4)
    cfg = SampleConfig(steps=4, best_of=3, reveal_noise=0.3, verifier=verifier)
    got = generate(model, None, context, cfg, torch.Generator().manual_seed(4), sudoku4)
    generator, rows = torch.Generator().manual_seed(4), context.repeat_interleave(3, 0)
    tokens, chain_scores = sample_chains(model, None, rows, cfg, generator)
    assert (chain_scores is None) == (verifier == "rules")
    scores = verify_chains(rows, tokens, chain_scores, cfg, sudoku4)
    assert torch.equal(got, choose(tokens, scores, 3))
    if verifier == "rules":  # the rules need the task: refused without it, in one line
        with pytest.raises(DihalValueError, match="--verifier rules checks the answers against the task's rules"):
            generate(model, None, context, cfg, torch.Generator().manual_seed(4))


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_the_draws_do_not_depend_on_the_verifier(sudoku4, kind):
    """The protocol samples each diversity source once and lets every verifier choose from those chains: sound only
    if scoring the chain (``verifier="chain"``) draws nothing, so tokens and generator state match a rules-verifier
    run's."""
    model, context = _model(sudoku4, kind), _context(sudoku4)
    source = protocol.DIVERSITY[kind][-1]  # a noisy source: the draws matter
    rows, ends = context.repeat_interleave(3, 0), []
    for verifier in VERIFIERS:
        generator = torch.Generator().manual_seed(7)
        cfg = SampleConfig(steps=4, best_of=3, verifier=verifier, **source)
        tokens, _ = sample_chains(model, make_kernel("uniform", 4), rows, cfg, generator)
        ends.append((tokens, torch.rand(4, generator=generator)))
    assert torch.equal(ends[0][0], ends[1][0]) and torch.equal(ends[0][1], ends[1][1])


def test_a_kept_choice_rebuilds_the_chosen_configs_over_the_users_other_fields():
    """A choice kept as JSON (``protocol_choice``) scores another test file with the same sampler: the chosen fields
    come from the choice, every other field from the sample it was chosen over."""
    sample = SampleConfig(steps=9, cfg_weight=1.5, batch_size=7)
    fields = {"steps": 4, "temperature": 0.0, "reveal_noise": 0.0, "givens": True, "verifier": "chain", "best_of": 1}
    chosen = {"single": fields, "best_of": {**fields, "reveal_noise": 0.1, "verifier": "rules", "best_of": 3}}
    single, diverse = protocol.chosen_configs(json.loads(json.dumps(chosen)), sample)
    assert single == replace(sample, **fields) and single.cfg_weight == 1.5 and single.batch_size == 7
    assert (diverse.best_of, diverse.reveal_noise, diverse.verifier, diverse.cfg_weight) == (3, 0.1, "rules", 1.5)
    assert protocol.chosen_configs(chosen)[0] == SampleConfig(**fields)


def test_pass_counter_counts_rows_through_the_main_network_and_every_block(sudoku4):
    context, steps = _context(sudoku4, 4), 5
    hcdlm = _model(sudoku4, "hcdlm", denoiser_blocks=2)
    with PassCounter(hcdlm) as cost:
        generate(hcdlm, make_kernel("uniform", 4), context, SampleConfig(steps=steps))
    assert cost.passes == 4 * steps  # one denoiser pass per step and row
    assert cost.block_passes == 4 * steps * (2 + 1)  # the denoiser's 2 blocks and the predictor's 1, every step
    mdm = _model(sudoku4, "mdm", baseline_blocks=3)
    with PassCounter(mdm) as cost:
        generate(mdm, None, context, SampleConfig(steps=steps))
    assert (cost.passes, cost.block_passes) == (4 * steps, 4 * steps * 3)


def _csv(path, rows) -> None:
    path.write_text("puzzle,solution\n" + "".join(f"{''.join(map(str, p))},{''.join(map(str, s))}\n" for p, s in rows))


def test_eval_protocol_reports_single_best_of_and_oracle_with_their_cost(tmp_path, capsys):
    from dihal_fast.cli import main
    from dihal_fast.hcdlm.trainer import train
    from dihal_fast.tasks.sudoku_grade import generate as generate_sudoku

    train(hcdlm_tiny_config(2, model={"kind": "mdm"}, warmup_steps=1), tmp_path / "mdm")
    rng, geo = random.Random("protocol-test"), sudoku4_geo()
    pool = [(tuple(p), tuple(s)) for p, s in json.loads((tmp_path / "mdm" / "puzzle_pool.json").read_text())]
    fresh = fresh_puzzles(lambda: generate_sudoku(rng, geo, "singles"), 7, geo, exclude=pool)
    _csv(tmp_path / "val.csv", fresh[:4])  # 4x4 has few puzzles up to symmetry: small splits
    _csv(tmp_path / "test.csv", fresh[4:])
    out = tmp_path / "eval.json"
    args = ["hcdlm", "eval", str(tmp_path / "mdm"), "--data", str(tmp_path / "test.csv"), "--out", str(out)]
    flags = ["--steps", "2", "--steps-sweep", "", "--no-diagnostics", "--protocol-k", "2"]
    assert main([*args, *flags, "--validation", str(tmp_path / "val.csv"), "--steps-choices", "2,4"]) == 0
    printed = capsys.readouterr().out
    assert "best_of" in printed and "oracle" in printed
    protocol = json.loads(out.read_text())["protocol"]
    single, best, oracle = protocol["rows"]
    assert [r["mode"] for r in protocol["rows"]] == ["single", "best_of", "oracle"]
    assert protocol["chosen"]["single"]["steps"] in (2, 4) and protocol["chosen"]["single"]["givens"] is True
    assert best["k"] == oracle["k"] == 2 and best["settings"] == oracle["settings"]
    assert oracle["accuracy"] >= best["accuracy"] and oracle["passes"] <= best["passes"]
    for row in (single, best, oracle):  # per-puzzle correctness, in the data file's order, behind the accuracy
        assert len(row["correct"]) == 3 and sum(row["correct"]) / 3 == pytest.approx(row["accuracy"])
    assert all(o >= b for o, b in zip(oracle["correct"], best["correct"]))
    assert single["passes"] <= protocol["chosen"]["single"]["steps"]
    mdm_parameters = models.sampling_parameters(build_model(SudokuTask(2, 2).spec, _tiny_mdm()))
    for row in (single, best, oracle, *protocol["validation"]):  # both counts; block passes at width 64 too
        assert row["parameters"] == row["sampling_parameters"] == mdm_parameters  # MDM samples with all of them
        assert row["width64_block_passes"] == pytest.approx(row["block_passes"] * (32 / 64) ** 2)
    assert len(protocol["validation"]) == 2 + 4 * 2  # two step counts, then MDM's four sources x two verifiers
    report = json.loads(out.read_text())
    assert report["trained_s"] > 0 and report["budget_clock"] == "wall"
    assert report["parameters"] == sum(p.numel() for p in build_model(SudokuTask(2, 2).spec, _tiny_mdm()).parameters())
    assert protocol["splits"] == {"training pool": 30, "validation": 4, "data": 3} and len(report["data_sha256"]) == 64
    run = load_run(tmp_path / "mdm", device="cpu")
    choose = partial(protocol_choice, run, examples_from_file(run.task, tmp_path / "val.csv"), SampleConfig(steps=2), 2)
    memo: dict = {}  # a choice killed after some candidates resumes from the rows kept for them
    whole = choose((2, 4), memo=memo)
    assert len(memo) == 2 + 4 and choose((2, 4), memo=dict(list(memo.items())[:3])) == whole
    kept = {key: [{**row, "accuracy": 2.0} for row in rows] for key, rows in list(memo.items())[1:2]}
    resumed = choose((2, 4), memo=kept)  # the kept row is read, not rescored
    assert resumed["validation"][1]["accuracy"] == 2.0 and resumed["chosen"]["single"]["steps"] == 4
    assert main([*args, *flags]) == 2  # no --validation: refused in one line, as a usage error
    assert "--validation" in capsys.readouterr().err
    _csv(tmp_path / "leak.csv", [*fresh[:3], pool[0]])  # a training puzzle in the validation set
    assert main([*args, *flags, "--validation", str(tmp_path / "leak.csv")]) == 2
    assert "may be a symmetric image of one in 'training pool'" in capsys.readouterr().err


def _tiny_mdm() -> HCDLMModelConfig:
    return hcdlm_tiny_config(2, model={"kind": "mdm"}).model


@pytest.mark.parametrize("box", [(2, 3), (3, 3)])
def test_baselines_are_matched_to_the_hcdlm_of_their_fields_or_say_so(box):
    spec = SudokuTask(*box).spec
    for kind in ("mdm", "ccdd", "ar"):
        match = models.parameter_match(spec, HCDLMModelConfig(kind=kind))
        assert match["matched"] and abs(match["ratio"] - 1) <= models.PARAMETER_TOLERANCE, (kind, match)
    small = models.parameter_match(spec, HCDLMModelConfig(kind="mdm", baseline_blocks=1))
    assert not small["matched"] and small["parameters"] < small["hcdlm_parameters"]
    assert models.parameter_match(spec, HCDLMModelConfig())["ratio"] == 1.0


def sudoku4_geo():
    from dihal_fast.tasks.sudoku import geometry

    return geometry(2, 2)


# A value other than the default for every field a kind might not read (the base objective trains the unconditional
# branch, so that --scaffold-drop is live; --guidance-training then changes to off).
_CHANGED_FIELDS = {
    "kernel": "absorbing",
    "logvar_bound": "clamp",
    "logvar_min": -5.0,
    "latent_schedule_power": 2.0,
    "scaffold_floor": 0.5,
    "self_condition": True,
    "latents": 2,
    "slot_readout": False,
    "lambda_recon": 0.3,
    "lambda_ent": 0.3,
    "lambda_cont": 0.3,
    "lambda_token": 0.3,
    "token_weighting": "schedule",
    "cont_weighting": "min_snr",
    "mask_aux_weight": 0.5,
    "mask_aux_rate": 0.5,
    "guidance_training": False,
    "scaffold_drop": 0.5,
    "timesteps": 7,
    "detach_latents": False,
    "exposure_share": 0.9,
    "exposure_ramp_steps": 10,
    "latent_drop": 0.5,
    "scaffold_blind": 0.5,
    "slot_aux_weight": 0.3,
}


def _training_and_sampling(task, kind: str, changed: dict) -> tuple:
    """What a run of ``kind`` computes with ``changed`` fields: its parameter count, the first step's loss and
    gradients, and a sampled answer (all from fixed seeds)."""
    objective_names = set(ObjectiveConfig.__dataclass_fields__)
    objective = {"guidance_training": True, **{k: v for k, v in changed.items() if k in objective_names}}
    model = {"kind": kind, **{k: v for k, v in changed.items() if k not in objective_names}}
    config = hcdlm_tiny_config(model=model, objective=objective)
    torch.manual_seed(0)
    net = build_model(task.spec, config.model)
    kernel = make_kernel(config.model.kernel, task.spec.target_vocab)
    context, target = task.train_batch(random.Random(0), 8)
    loss = RunObjective(net, kernel, config.objective)(context, target, torch.Generator().manual_seed(1))["loss"]
    loss.backward()
    grads = [p.grad.clone() for p in net.parameters() if p.grad is not None]
    with torch.no_grad():
        answer = KINDS[kind].sample(
            net.eval(), kernel, context, SampleConfig(steps=4, temperature=1.0), torch.Generator().manual_seed(2), None
        )
    return sum(p.numel() for p in net.parameters()), loss.item(), grads, answer


def _same(a: tuple, b: tuple) -> bool:
    return a[:2] == b[:2] and len(a[2]) == len(b[2]) and all(map(torch.equal, a[2], b[2])) and torch.equal(a[3], b[3])


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_a_kind_reads_every_field_but_the_ones_it_is_said_not_to(sudoku4, kind):
    """The table of unread fields is exact: changing one of them changes nothing a run computes; changing any other
    field of the list changes its parameters, loss, gradients or answers."""
    assert set(UNREAD_FIELDS[kind]) <= set(_CHANGED_FIELDS)
    base = _training_and_sampling(sudoku4, kind, {})
    unchanged = {
        name
        for name, value in _CHANGED_FIELDS.items()
        if _same(_training_and_sampling(sudoku4, kind, {name: value}), base)
    }
    assert unchanged == set(UNREAD_FIELDS[kind])


def test_a_field_the_kind_never_reads_is_refused_before_any_work(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["hcdlm", "train", "--task", "sudoku", "--model", "mdm", "--kernel", "absorbing", "--guidance-training"]
    assert run_cli([*argv, "--out", str(run)]) == 2
    assert "--model mdm never reads --kernel absorbing, --guidance-training" in error_line(capsys)
    assert not run.exists()
    with pytest.raises(DihalValueError, match="--model latent never reads --scaffold-blind 0.2"):
        RunConfig.for_task(name="sudoku", kind="latent", scaffold_blind=0.2)
    # the default value, or a field the kind reads, is taken
    assert RunConfig.for_task(name="sudoku", kind="mdm", kernel="uniform", latents=2).model.latents == 2
    assert RunConfig.for_task(name="sudoku", kind="ccdd", lambda_cont=0.1).objective.lambda_cont == 0.1


_CHANGED_SAMPLE = {
    "cfg_weight": 2.0,
    "remask": "confidence",
    "order": "prob",
    "clamp": True,
    "givens": True,
    "reveal_noise": 0.3,
    "steps": 3,
    "temperature": 0.5,
}


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_a_sampler_reads_every_option_but_the_ones_it_is_said_not_to(sudoku4, kind):
    """``ModelKind.unread_sample`` is exact (AR's ``steps`` aside, let through on purpose): changing a listed option
    changes no answer or chain score, changing any other does; a listed option is refused by the front door."""
    model, context = _model(sudoku4, kind), _context(sudoku4)
    kernel = make_kernel("uniform", 4)

    def chains(**fields) -> tuple[torch.Tensor, torch.Tensor]:
        log_prob = torch.zeros(context.shape[0], dtype=torch.float64)
        cfg = replace(SampleConfig(steps=4, temperature=1.0), **fields)
        tokens = KINDS[kind].sample(model, kernel, context, cfg, torch.Generator().manual_seed(2), log_prob)
        return tokens, log_prob

    base = chains()
    unchanged = {
        name for name, value in _CHANGED_SAMPLE.items() if all(map(torch.equal, chains(**{name: value}), base))
    }
    assert unchanged - ({"steps"} if kind == "ar" else set()) == set(KINDS[kind].unread_sample)
    for name in KINDS[kind].unread_sample:
        with pytest.raises(DihalValueError, match=f"the {kind} sampler never reads --"):
            generate(model, kernel, context, replace(SampleConfig(steps=4), **{name: _CHANGED_SAMPLE[name]}))
