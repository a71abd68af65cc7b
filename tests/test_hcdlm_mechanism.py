"""Mechanism diagnostics of ``dihal hcdlm eval`` (issue 23): per-step decoded answer of HC-DLM and MDM,
and the read-out with x_t / the scaffold replaced, on tiny 4x4 Sudoku models trained inside the test."""

from __future__ import annotations

import json
import random

import pytest
import torch

from dihal_fast.cli import main
from dihal_fast.hcdlm.config import HCDLMModelConfig, HCDLMTrainConfig, ObjectiveConfig, RunConfig, SampleConfig
from dihal_fast.hcdlm.mechanism import ablation_effects, ablation_readout, in_sampler_interventions
from dihal_fast.hcdlm.networks import MDMNet
from dihal_fast.hcdlm.sampler import sample_mdm
from dihal_fast.hcdlm.trainer import train
from dihal_fast.tasks.registry import TaskConfig
from dihal_fast.tasks.sudoku import geometry
from dihal_fast.tasks.sudoku_grade import generate
from dihal_fast.tasks.sudoku_task import SudokuTask, generate_pool


def _run_config(kind: str, steps: int) -> RunConfig:
    # exposure 0: the paper's training, where x_t carries the answer at low noise and the scaffold at high
    return RunConfig(
        task=TaskConfig("sudoku", sudoku_box="2x2", sudoku_pool=200),
        model=HCDLMModelConfig(
            kind=kind,
            hidden=32,
            heads=2,
            encoder_blocks=1,
            denoiser_blocks=2,
            predictor_blocks=1,
            latent_dim=16,
            slot_head=kind == "hcdlm",
        ),
        objective=ObjectiveConfig(exposure_share=0.0, slot_aux_weight=1.0 if kind == "hcdlm" else 0.0),
        train=HCDLMTrainConfig(
            steps=steps,
            batch_size=32,
            lr=3e-3,
            warmup_steps=20,
            log_every=100,
            checkpoint_every=10**6,
            threads=1,
            device="cpu",
        ),
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 300-step HC-DLM and a 50-step MDM on 4x4 Sudoku, and a CSV of 60 fresh puzzles (a few CPU-seconds)."""
    root = tmp_path_factory.mktemp("mechanism")
    train(_run_config("hcdlm", 300), root / "hcdlm")
    train(_run_config("mdm", 50), root / "mdm")
    rng, geo = random.Random("mechanism-test"), geometry(2, 2)
    rows = [generate(rng, geo, "singles") for _ in range(60)]
    csv = root / "fresh.csv"
    csv.write_text("puzzle,solution\n" + "".join(f"{''.join(map(str, p))},{''.join(map(str, s))}\n" for p, s in rows))
    return root


def test_each_ablation_moves_the_readout_of_a_model_that_uses_its_inputs(trained):
    """Trained with exposure 0, the model reads x_t at low noise and the scaffold at high noise: replacing
    either changes the blank-cell read-out by >= 5 points somewhere, and a true scaffold beats a random one."""
    from dihal_fast.hcdlm.eval_data import examples_from_file
    from dihal_fast.hcdlm.scoring import load_run

    run = load_run(trained / "hcdlm", device="cpu")
    rows = ablation_readout(run, examples_from_file(run.task, trained / "fresh.csv"), (0.05, 0.5, 0.95))
    assert [r["s"] for r in rows] == [0.05, 0.5, 0.95]
    effects = ablation_effects(rows, "blank_cells")
    assert effects["x_t_noise"] <= -0.05, effects
    assert effects["scaffold_true"] >= 0.05 and effects["scaffold_random"] <= -0.05, effects
    assert effects["true_minus_random_scaffold"] >= 0.05, effects
    with pytest.raises(ValueError, match="noise levels"):
        ablation_readout(run, [], (0.0,))


def test_eval_writes_the_mechanism_diagnostics_with_a_comparison(trained, capsys):
    out = trained / "eval.json"
    assert (
        main(
            [
                "hcdlm",
                "eval",
                str(trained / "hcdlm"),
                "--data",
                str(trained / "fresh.csv"),
                "--out",
                str(out),
                "--steps",
                "4",
                "--steps-sweep",
                "2,4",
                "--compare",
                str(trained / "mdm"),
                "--noise-levels",
                "0.05,0.95",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "mdm (--compare)" in printed and "oracle ablations" in printed and "in-sampler interventions" in printed
    report = json.loads(out.read_text())
    assert report["compare"]["model"] == "mdm" and [r["steps"] for r in report["compare"]["accuracy_vs_steps"]] == [
        2,
        4,
    ]
    trajectories = report["trajectory"]
    assert set(trajectories) == {"hcdlm (uniform)", "mdm"}
    for rows in trajectories.values():
        assert [r["fraction"] for r in rows] == [0.25, 0.5, 0.75, 1.0]
    assert trajectories["mdm"][-1]["accuracy"] == report["compare"]["accuracy"]  # the last read-out is MDM's answer
    assert trajectories["hcdlm (uniform)"][-1]["accuracy"] == report["accuracy"]
    assert [r["s"] for r in report["oracle_ablations"]] == [0.05, 0.95]
    assert report["oracle_ablation_key"] == "blank_cells"
    variants = report["interventions"]["variants"]
    assert set(variants) == {"normal", "latent_prior", "latent_other", "latent_reencoded", "scaffold_prior"}
    assert variants["normal"]["accuracy"] == report["accuracy"]  # the normal chain is the evaluation's own
    gap = report["interventions"]["latent_beyond_tokens"]
    assert gap["low"] <= gap["difference"] <= gap["high"]
    assert gap["difference"] == pytest.approx(variants["normal"]["accuracy"] - variants["latent_reencoded"]["accuracy"])
    for suffix in ("steps", "trajectory", "ablations", "readout"):
        assert (trained / f"eval.{suffix}.png").stat().st_size > 0


def test_a_subset_of_interventions_scores_as_in_the_full_set(trained):
    """Each intervention's chain starts from the same seed: asked for ``latent_reencoded`` alone, the normal and
    re-encoded chains score exactly as in the full set; a set without it is refused (it defines the gap)."""
    from dihal_fast.hcdlm.eval_data import examples_from_file
    from dihal_fast.hcdlm.scoring import load_run

    run = load_run(trained / "hcdlm", device="cpu")
    examples, cfg = examples_from_file(run.task, trained / "fresh.csv")[:12], SampleConfig(steps=3)
    full = in_sampler_interventions(run, examples, cfg, seed=2)
    part = in_sampler_interventions(run, examples, cfg, seed=2, interventions=("latent_reencoded",))
    assert set(part["variants"]) == {"normal", "latent_reencoded"}
    assert all(part["correct"][name] == full["correct"][name] for name in part["correct"])
    assert part["latent_beyond_tokens"] == full["latent_beyond_tokens"]
    with pytest.raises(ValueError, match="must include latent_reencoded"):
        in_sampler_interventions(run, examples, cfg, interventions=("latent_prior",))


def test_mdm_readout_fills_masked_slots_and_ends_at_the_answer():
    task = SudokuTask(2, 2)
    task.pool = generate_pool(task.geo, 10, "singles", seed=0)
    context, _ = task.train_batch(random.Random(0), 3)
    torch.manual_seed(0)
    model = MDMNet(task.spec, HCDLMModelConfig(hidden=32, heads=2), blocks=1).eval()
    seen = []
    out = sample_mdm(
        model, context, SampleConfig(steps=20), on_step=lambda i, decoded: seen.append((i, decoded.clone()))
    )
    assert [i for i, _ in seen] == list(range(1, 21))  # every step, also those that reveal no token (20 > 16 slots)
    assert all(not bool((d == model.mask_id).any()) for _, d in seen)
    assert torch.equal(seen[-1][1], out)
    assert torch.equal(sample_mdm(model, context, SampleConfig(steps=20)), out)  # the hook changes nothing


def test_bad_compare_runs_and_levels_are_one_line_errors(trained, tmp_path, capsys):
    other = tmp_path / "cd"
    assert (
        main(
            [
                "hcdlm",
                "train",
                "--task",
                "countdown",
                "--model",
                "mdm",
                "--out",
                str(other),
                "--steps",
                "1",
                "--countdown-numbers",
                "3",
                "--hidden",
                "32",
                "--heads",
                "2",
                "--batch-size",
                "4",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    capsys.readouterr()
    args = [
        "hcdlm",
        "eval",
        str(trained / "hcdlm"),
        "--data",
        str(trained / "fresh.csv"),
        "--out",
        str(tmp_path / "e.json"),
        "--steps",
        "2",
    ]
    assert main([*args, "--compare", str(other)]) == 2
    assert "another task" in capsys.readouterr().err
    with pytest.raises(SystemExit) as parse_error:  # argparse's own one-line usage error
        main([*args, "--noise-levels", "0.5,x"])
    assert parse_error.value.code == 2 and "comma-separated numbers" in capsys.readouterr().err
    assert main([*args, "--noise-levels", "1.5"]) == 2
    assert "--noise-levels must be <= 1.0, got 1.5" in capsys.readouterr().err
    assert main([*args, "--noise-levels", "0"]) == 2
    assert "--noise-levels must be > 0.0, got 0.0" in capsys.readouterr().err
