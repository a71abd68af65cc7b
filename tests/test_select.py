"""Selection: repeated-subsample estimates against direct calls, the selected layer, errors, the plot."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dihal_fast import geometry_proxies, selection_scores
from dihal_fast.select import GeometryEstimate, estimate_geometry, plot_geometry, subsample


def _layers(n: int = 400, dim: int = 12, seed: int = 0) -> dict[int, np.ndarray]:
    """Layer 3 is compact and concentrated on few directions (the best by every proxy); the rest are isotropic."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n, dim))
    out = {layer: base + 0.3 * rng.standard_normal((n, dim)) for layer in (1, 2, 4, 5)}
    out[3] = 0.05 * base * np.linspace(3.0, 0.05, dim)
    return out


@given(available=st.integers(2, 500), data=st.data(), seed=st.integers(0, 2**32), repeat=st.integers(0, 50))
def test_subsample_rows_are_distinct_sorted_and_reproducible(available, data, seed, repeat):
    n = data.draw(st.integers(1, available))
    rows, pair_seed = subsample(available, n, seed, repeat)
    assert rows.size == n and np.all(np.diff(rows) > 0) and 0 <= rows[0] and rows[-1] < available
    again, same_seed = subsample(available, n, seed, repeat)
    assert np.array_equal(rows, again) and pair_seed == same_seed


def test_estimate_matches_direct_proxies_and_scores():
    vectors = _layers()
    layers = sorted(vectors)
    est = estimate_geometry(vectors, layers, repeats=3, sample_size=150, k=8, n_pairs=800, seed=7)
    assert est.layers == layers and est.values["m_curv"].shape == (3, len(layers))
    for r in range(3):
        rows, pair_seed = subsample(400, 150, 7, r)
        direct = {l: geometry_proxies(vectors[l][rows], k=8, n_pairs=800, seed=pair_seed) for l in layers}
        scores, _ = selection_scores(direct)
        for i, l in enumerate(layers):
            for name in ("m_curv", "m_mono", "k_eff"):
                assert est.values[name][r, i] == direct[l][name]
            assert est.values["score"][r, i] == pytest.approx(scores[l], abs=1e-12)
    mean, std = est.mean_std("score")
    assert est.selected_layer == layers[int(np.argmax(mean))] == 3
    np.testing.assert_allclose(std, est.values["score"].std(axis=0, ddof=1))


def test_summary_has_raw_and_log_mean_std_per_layer():
    est = estimate_geometry(_layers(), [2, 3, 4], repeats=2, sample_size=100, k=5, n_pairs=300)
    rows = est.summary()
    assert [r["layer"] for r in rows] == [2, 3, 4]
    for i, row in enumerate(rows):
        for name in ("m_curv", "m_mono", "k_eff"):
            raw, logs = est.values[name][:, i], np.log(est.values[name][:, i])
            assert row[name]["mean"] == pytest.approx(raw.mean())
            assert row[name]["std"] == pytest.approx(raw.std(ddof=1))
            assert row[f"log_{name}"]["mean"] == pytest.approx(logs.mean())
            assert row[f"log_{name}"]["std"] == pytest.approx(logs.std(ddof=1))
        assert set(row["score"]) == {"mean", "std"}


def test_single_repeat_has_no_std_and_torch_input_works():
    vectors = {l: torch.from_numpy(v).float() for l, v in _layers().items()}
    est = estimate_geometry(vectors, [1, 3], repeats=1, sample_size=80, k=4, n_pairs=200)
    assert all(row["score"]["std"] is None for row in est.summary())
    assert est.selected_layer == 3


def test_ties_go_to_the_shallower_layer():
    scores = np.array([[0.5, 1.0, 1.0, -2.5], [0.5, 2.0, 2.0, -4.5]])
    est = GeometryEstimate([2, 5, 7, 9], {"score": scores})
    assert est.selected_layer == 5
    same = _layers()[1]
    est = estimate_geometry(
        {2: same, 5: same.copy(), 7: same.copy()}, [7, 5, 2], repeats=2, sample_size=60, k=4, n_pairs=100
    )
    assert est.layers == [2, 5, 7] and est.selected_layer == 2
    for name in ("m_curv", "m_mono", "k_eff"):
        assert np.all(est.values[name] == est.values[name][:, :1])  # identical layers, identical proxies


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(sample_size=401), "sample size 401 exceeds the 400 sampled tokens"),
        (dict(layers=[3]), "at least 2 candidate layers"),
        (dict(layers=[3, 9]), r"no sampled vectors for layers \[9\]"),
        (dict(repeats=0), "repeats must be a positive integer"),
        (dict(sample_size=1), "sample size must be an integer >= 2"),
    ],
)
def test_bad_requests_are_clear_errors(kwargs, message):
    layers = kwargs.pop("layers", [1, 2, 3])
    with pytest.raises(ValueError, match=message):
        estimate_geometry(_layers(), layers, **{"sample_size": 50, "k": 4, **kwargs})


def test_layers_with_different_tokens_are_rejected():
    vectors = _layers()
    vectors[2] = vectors[2][:300]
    with pytest.raises(ValueError, match="same sampled tokens"):
        estimate_geometry(vectors, [1, 2], sample_size=50, k=4)


def test_plot_writes_a_png(tmp_path):
    est = estimate_geometry(_layers(), [1, 2, 3, 4, 5], repeats=2, sample_size=80, k=4, n_pairs=200)
    path = plot_geometry(est, tmp_path / "sub" / "geometry.png", title="test")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
