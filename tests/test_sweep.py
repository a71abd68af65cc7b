"""Score vs bridge-loss analysis: correlations over repeated runs, rank gap, plot; and the sweep CLI."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dihal_fast.evaluate.correlation import plot_sweep, score_loss_correlations


def test_perfect_agreement_and_reversal():
    layers = [1, 2, 3, 4]
    loss = [0.4, 0.3, 0.2, 0.1]  # deeper = easier here
    agree = score_loss_correlations(layers, np.array([[1.0, 2.0, 3.0, 4.0]]), loss)
    for name in ("spearman", "kendall", "pearson"):
        assert agree[name]["mean"] == pytest.approx(1.0) and agree[name]["std"] is None  # one run
    assert agree["rank_gap"] == 0 and agree["predicted_layer"] == 4 == agree["observed_best_layer"]
    reverse = score_loss_correlations(layers, np.array([[4.0, 3.0, 2.0, 1.0]]), loss)
    assert reverse["spearman"]["mean"] == pytest.approx(-1.0)
    assert reverse["rank_gap"] == 3 and reverse["layer_gap"] == 3 and reverse["predicted_loss_rank_fraction"] == 1.0


def test_mean_and_std_over_runs_hand_computed():
    layers = [1, 2, 3, 4]
    loss = [0.4, 0.3, 0.2, 0.1]
    runs = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 4.0, 3.0]])
    out = score_loss_correlations(layers, runs, loss)
    # second run: one adjacent swap -> Spearman 1 - 6*2/(4*15) = 0.8, Kendall (5-1)/6 = 2/3
    assert out["spearman"]["mean"] == pytest.approx(0.9) and out["spearman"]["std"] == pytest.approx(0.2 / 2**0.5)
    assert out["kendall"]["mean"] == pytest.approx((1 + 2 / 3) / 2)
    want_pearson = [stats.pearsonr(run, -np.array(loss))[0] for run in runs]
    assert out["pearson"]["mean"] == pytest.approx(np.mean(want_pearson))
    # mean score is [1, 2, 3.5, 3.5]: the tie goes to the shallower layer 3, second-best loss -> rank gap 1
    assert out["predicted_layer"] == 3 and out["rank_gap"] == 1 and out["layer_gap"] == 1


def test_constant_runs_are_left_out_and_bad_input_rejected():
    out = score_loss_correlations([1, 2, 3], np.array([[1.0, 1.0, 1.0], [1.0, 2.0, 3.0]]), [3.0, 2.0, 1.0])
    assert out["spearman"]["n_runs"] == 1 and out["spearman"]["mean"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match=">= 3 layers"):
        score_loss_correlations([1, 2], np.array([[1.0, 2.0]]), [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        score_loss_correlations([1, 2, 3], np.array([[1.0, 2.0, np.nan]]), [1.0, 2.0, 3.0])


def test_plot_is_written(tmp_path):
    rows = [
        {"layer": l, "score": s, "score_std": 0.1, "bridge_loss": b}
        for l, s, b in [(1, 1.0, 0.3), (2, 0.0, 0.5), (3, -1.0, 0.9)]
    ]
    corr = score_loss_correlations([1, 2, 3], np.array([[1.0, 0.0, -1.0]]), [0.3, 0.5, 0.9])
    path = plot_sweep(tmp_path / "sweep.png", rows, corr)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _sweep_argv(model, corpus, out, *extra):
    return [
        "sweep",
        "--model",
        str(model),
        "--corpus",
        str(corpus),
        "--out",
        str(out),
        "--budget-steps",
        "2",
        "--score-repeats",
        "3",
        "--score-sample",
        "40",
        "--max-tokens",
        "1024",
        "--seq-len",
        "32",
        "--batch-size",
        "2",
        "--val-blocks",
        "2",
        *extra,
    ]


def test_sweep_cli_end_to_end_and_resume(tiny_checkpoints, tmp_path, capsys):
    from dihal_fast.cli import main
    from dihal_fast.common import read_json

    corpus = tmp_path / "text.txt"
    corpus.write_text(
        "\n\n".join(f"Story {i}: a fox and a dog went to the river {i % 7} and read books." for i in range(60))
    )
    out = tmp_path / "sweep"
    assert main(_sweep_argv(tiny_checkpoints["llama"], corpus, out)) == 0
    report = read_json(out / "sweep.json")
    assert [row["layer"] for row in report["layers"]] == [1, 2, 3]
    locate = read_json(out / "locate" / "locate.json")
    for row in report["layers"]:
        assert row["bridge_loss"] == read_json(out / f"layer_{row['layer']:02d}" / "result.json")["bridge_loss"]
        assert row["score"] == next(r["score"]["mean"] for r in locate["layers"] if r["layer"] == row["layer"])
    want = score_loss_correlations(
        [1, 2, 3], np.array(locate["per_repeat"]["score"]), [row["bridge_loss"] for row in report["layers"]]
    )
    for name in ("spearman", "kendall", "pearson"):
        assert report[name] == want[name] and set(report[name]) >= {"mean", "std"}
    assert report["rank_gap"] == want["rank_gap"] and (out / "sweep.png").is_file()
    assert report["corpus_tokens"]["locate"] == locate["corpus_tokens"] == {str(corpus): 1024}
    assert list(report["corpus_tokens"]["train"]) == [str(corpus)] and report["protocol"]["documents"]
    stamp = (out / "layer_02" / "result.json").stat().st_mtime_ns
    assert main(_sweep_argv(tiny_checkpoints["llama"], corpus, out)) == 0  # reuses every finished stage
    assert (out / "layer_02" / "result.json").stat().st_mtime_ns == stamp
    assert main(_sweep_argv(tiny_checkpoints["llama"], corpus, tmp_path / "bad", "--layers", "1", "9")) == 2
    assert "out of range" in capsys.readouterr().err


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_a_sweep_rerun_with_other_inputs_is_refused_never_relabelled(tiny_checkpoints, tmp_path, capsys):
    from dihal_fast.cli import main
    from dihal_fast.common import read_json

    corpus = tmp_path / "text.txt"
    corpus.write_text("\n\n".join(f"Story {i}: a fox and a dog went to the river {i % 7}." for i in range(60)))
    other = tmp_path / "other.txt"
    other.write_text(corpus.read_text().replace("fox", "cat"))
    out, model = tmp_path / "sweep", tiny_checkpoints["llama"]
    assert main(_sweep_argv(model, corpus, out, "--layers", "1", "2", "3")) == 0
    report = (out / "sweep.json").read_bytes()
    for extra, field in [
        (["--budget-steps", "3"], "train.steps 2 -> 3"),
        (["--seed", "1"], "seed 0 -> 1"),
        (["--score-repeats", "4"], "locate.repeats 3 -> 4"),
    ]:
        assert main(_sweep_argv(model, corpus, out, "--layers", "1", "2", "3", *extra)) == 2
        line = _one_error(capsys)
        assert field in line and "--overwrite" in line, line
    assert main(_sweep_argv(model, other, out, "--layers", "1", "2", "3")) == 2
    assert "corpus" in _one_error(capsys)
    assert (out / "sweep.json").read_bytes() == report  # nothing relabelled
    assert main(_sweep_argv(model, corpus, out, "--layers", "1", "2", "3", "--budget-steps", "3", "--overwrite")) == 0
    assert read_json(out / "sweep.json")["settings"]["budget_steps"] == 3
    for layer in (1, 2, 3):
        assert read_json(out / f"layer_{layer:02d}" / "train_config.json")["steps"] == 3
        assert read_json(out / f"layer_{layer:02d}" / "result.json")["steps"] == 3


def test_sweep_passes_its_rate_on_and_warns_when_no_bridge_learned(tiny_checkpoints, tmp_path, monkeypatch, caplog):
    import logging

    from dihal_fast.pipeline import sweep_stage
    from dihal_fast.pipeline.sweep_stage import SweepBudgetConfig, SweepConfig

    train = SweepBudgetConfig(lr=1e-4, warmup_steps=3).train_config()
    assert (train.lr, train.warmup_steps, train.copied_layers) == (1e-4, 3, 0)
    corpus = tmp_path / "text.txt"
    corpus.write_text("\n\n".join(f"A fox and a dog went to the river {i % 7} and read books." for i in range(60)))

    def no_learning(out, model, layers, corpus, train, workers=1):
        return {layer: {"bridge_loss": 1.0 + layer / 100, "hybrid_dir": str(out / str(layer))} for layer in layers}

    monkeypatch.setattr(sweep_stage, "sweep_bridges", no_learning)
    settings = SweepBudgetConfig(budget_steps=1, score_repeats=3, score_sample=64, max_tokens=1024, seq_len=32)
    config = SweepConfig(model=str(tiny_checkpoints["llama"]), corpus=[str(corpus)], settings=settings)
    with caplog.at_level(logging.WARNING):
        report = sweep_stage.sweep(config, tmp_path / "sweep")
    assert report["bridges_learned"] is False and "no better than predicting the mean" in caplog.text
