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
    rows = [{"layer": l, "score": s, "score_std": 0.1, "bridge_loss": b} for l, s, b in [(1, 1.0, 0.3), (2, 0.0, 0.5), (3, -1.0, 0.9)]]
    corr = score_loss_correlations([1, 2, 3], np.array([[1.0, 0.0, -1.0]]), [0.3, 0.5, 0.9])
    path = plot_sweep(tmp_path / "sweep.png", rows, corr)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
