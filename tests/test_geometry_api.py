"""Public API contract: argument checking, backend switch, selection score, streaming covariance."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dihal_fast as df
from dihal_fast import reference as ref

FUNCS = {
    "knn": lambda X: df.knn(X, 2),
    "effective_rank": df.effective_rank,
    "monotonicity_proxy": lambda X: df.monotonicity_proxy(X, n_pairs=10),
    "curvature_proxy": lambda X: df.curvature_proxy(X, k=2),
    "geometry_proxies": lambda X: df.geometry_proxies(X, k=2, n_pairs=10),
}


def good(n: int = 10, D: int = 4) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(n, D))


@pytest.mark.parametrize("name", sorted(FUNCS))
@pytest.mark.parametrize(
    "bad,error,message",
    [
        (np.array([[1.0, np.nan], [0.0, 1.0], [2.0, 2.0]]), ValueError, "NaN or Inf"),
        (np.array([[1.0, np.inf], [0.0, 1.0], [2.0, 2.0]]), ValueError, "NaN or Inf"),
        (np.arange(12).reshape(4, 3), TypeError, "floating dtype"),
        (np.ones((4, 3), dtype=bool), TypeError, "floating dtype"),
        (np.ones((4, 3), dtype=np.complex128), TypeError, "floating dtype"),
        (np.array([[1.0, 2.0], [3.0]], dtype=object), TypeError, "floating dtype"),
        ([[1.0, 2.0], [3.0]], TypeError, "could not convert"),
        (np.ones(5), ValueError, "must be 2-D"),
        (np.ones((2, 3, 4)), ValueError, "must be 2-D"),
        (np.ones((5, 0)), ValueError, "at least one feature"),
        (np.ones((1, 3)), ValueError, "at least 2 rows"),
        (torch.ones(4, 3, dtype=torch.int32), TypeError, "floating dtype"),
        (torch.tensor([[1.0, float("nan")], [1.0, 2.0], [0.0, 0.0]]), ValueError, "NaN or Inf"),
        ("not an array", TypeError, "floating dtype"),
    ],
)
def test_bad_inputs_raise_clear_errors(name, bad, error, message):
    with pytest.raises(error, match=message):
        FUNCS[name](bad)


def test_k_checks():
    X = good(5)
    for k, error in [
        (5, ValueError),
        (9, ValueError),
        (0, ValueError),
        (-1, ValueError),
        (2.5, TypeError),
        (True, TypeError),
    ]:
        with pytest.raises(error, match="k must"):
            df.knn(X, k)
    with pytest.raises(ValueError, match="k must satisfy"):
        df.curvature_proxy(X, k=5)


def test_parameter_checks():
    X = good()
    with pytest.raises(ValueError, match="ridge"):
        df.monotonicity_proxy(X, ridge=0)
    with pytest.raises(ValueError, match="ridge"):
        df.geometry_proxies(X, ridge=float("nan"))
    with pytest.raises(TypeError, match="n_pairs"):
        df.monotonicity_proxy(X, n_pairs=1.5)
    with pytest.raises(ValueError, match="n_pairs"):
        df.monotonicity_proxy(X, n_pairs=0)


def test_constant_rows_are_an_error_not_nan():
    with pytest.raises(ValueError, match="zero variance"):
        df.geometry_proxies(np.ones((20, 3)), k=3)
    with pytest.raises(ValueError, match="zero variance"):
        df.effective_rank(np.ones((20, 3)))


def test_backend_switch():
    X = good(40, 6)
    assert df.geometry_proxies(X, k=3, backend="reference") == ref.geometry_proxies(X, k=3)
    with pytest.raises(ValueError, match="backend must be one of"):
        df.effective_rank(X, backend="gpu")
    info = df.build_info()
    assert info["backends"]["cpu"]["available"], info
    if not info["backends"]["cuda"]["available"]:
        with pytest.raises(df.BackendUnavailable, match="CUDA|cuda"):
            df.effective_rank(X, backend="cuda")


@given(
    hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=0, max_dims=3, max_side=6),
        elements=st.floats(allow_nan=True, allow_infinity=True, width=64),
    )
)
def test_fuzz_never_crashes(X):
    """Any float array either works or raises a ValueError/TypeError: never a crash or a NaN result."""
    for name, func in FUNCS.items():
        try:
            out = func(X)
        except (ValueError, TypeError):
            continue
        values = (
            out.values() if isinstance(out, dict) else [out] if np.isscalar(out) else [np.asarray(o).sum() for o in out]
        )
        assert all(np.isfinite(v) for v in values), (name, out)


def test_selection_scores_match_reference_and_ties():
    rng = np.random.default_rng(1)
    proxies = {
        l: {"m_curv": rng.uniform(1, 9), "m_mono": rng.uniform(1, 9), "k_eff": rng.uniform(1, 9)} for l in range(1, 8)
    }
    scores, best = df.selection_scores(proxies)
    want_scores, want_best = ref.selection_scores(proxies)
    assert best == want_best
    for layer in proxies:
        assert scores[layer] == pytest.approx(want_scores[layer], rel=1e-12, abs=1e-12)
    assert best == max(scores, key=lambda l: (scores[l], -l))
    twins = {
        3: {"m_curv": 2.0, "m_mono": 2.0, "k_eff": 1.0},
        5: {"m_curv": 2.0, "m_mono": 2.0, "k_eff": 1.0},
        1: {"m_curv": 1.0, "m_mono": 1.0, "k_eff": 2.0},
    }
    assert df.selection_scores(twins)[1] == 3  # tie -> shallower layer
    with pytest.raises(ValueError, match="at least 2 candidate layers"):  # issue 21: was ({4: 0.0}, 4)
        df.selection_scores({4: {"m_curv": 1.0, "m_mono": 1.0, "k_eff": 1.0}})
    with pytest.raises(TypeError, match="layer keys must be integers"):
        df.selection_scores({"1": twins[3], "2": twins[5]})


@pytest.mark.parametrize(
    "proxies,message",
    [
        ({}, "empty"),
        ({1: {"m_curv": 1.0, "m_mono": 1.0}}, "k_eff"),
        ({1: {"m_curv": 0.0, "m_mono": 1.0, "k_eff": 1.0}}, "m_curv"),
        ({1: {"m_curv": 1.0, "m_mono": float("nan"), "k_eff": 1.0}}, "m_mono"),
    ],
)
def test_selection_scores_bad_input(proxies, message):
    with pytest.raises(ValueError, match=message):
        df.selection_scores(proxies)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streaming_covariance_random_splits_and_merges(backend, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(1500, 23)) * rng.uniform(0.1, 10, size=23) + rng.normal(size=23) * 50
    cuts = np.sort(rng.choice(np.arange(1, len(X)), size=7, replace=False))
    parts = np.split(X, cuts)
    accs = []
    for part in parts:
        acc = df.StreamingCovariance(23, backend=backend)
        for chunk in np.array_split(part, rng.integers(1, 4)):
            acc.update(chunk)
        accs.append(acc)
    total = accs[0]
    for acc in accs[1:]:
        total.merge(acc)
    want = np.cov(X, rowvar=False, bias=True)
    assert total.count == len(X)
    np.testing.assert_allclose(total.mean, X.mean(axis=0), rtol=1e-12)
    assert np.abs(total.covariance - want).max() <= 1e-10 * np.abs(want).max()
    np.testing.assert_array_equal(total.covariance, total.covariance.T)


def test_streaming_covariance_float64_precision_is_split_invariant():
    rng = np.random.default_rng(9)
    X = (rng.normal(size=(3000, 30)) * 3 + 40).astype(np.float32)
    one = df.StreamingCovariance(30, precision="float64").update(X)
    many = df.StreamingCovariance(30, precision="float64")
    for chunk in np.array_split(X, 17):
        many.update(chunk)
    want = np.cov(X.astype(np.float64), rowvar=False, bias=True)
    for acc in (one, many):
        assert np.abs(acc.covariance - want).max() <= 1e-12 * np.abs(want).max()
    with pytest.raises(ValueError, match="precision"):
        df.StreamingCovariance(3, precision="float16")


def test_selection_scores_constant_column_up_to_rounding():
    same = {"m_curv": 0.3913, "m_mono": 0.8944, "k_eff": 5.714}
    scores, best = df.selection_scores({2: same, 5: dict(same), 7: dict(same)})
    assert scores == {2: 0.0, 5: 0.0, 7: 0.0} and best == 2
    assert ref.selection_scores({2: same, 5: same, 7: same}) == (scores, best)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, torch.bfloat16])
def test_streaming_covariance_low_precision_inputs(dtype):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(3000, 40)) + 5
    Xd = torch.from_numpy(X).to(dtype) if dtype is torch.bfloat16 else X.astype(dtype)
    acc = df.StreamingCovariance(40).update(Xd[:1234]).update(Xd[1234:])
    want = np.cov(ref.to_float64(Xd), rowvar=False, bias=True)  # of the rounded values
    assert np.abs(acc.covariance - want).max() <= 1e-5 * np.abs(want).max()


def test_streaming_covariance_state_round_trip_and_errors(tmp_path):
    from safetensors.torch import load_file, save_file

    X = good(100, 5)
    acc = df.StreamingCovariance(5).update(X)
    save_file(acc.state_dict(), tmp_path / "cov.safetensors")
    restored = df.StreamingCovariance(5).load_state_dict(load_file(tmp_path / "cov.safetensors"))
    assert restored.count == 100
    np.testing.assert_array_equal(restored.covariance, acc.covariance)
    restored.update(X[:10])
    acc.update(X[:10])
    np.testing.assert_allclose(restored.covariance, acc.covariance, rtol=1e-14)

    with pytest.raises(ValueError, match="different dimensions"):
        acc.merge(df.StreamingCovariance(6))
    with pytest.raises(TypeError):
        acc.merge(np.zeros(5))
    with pytest.raises(ValueError, match="columns"):
        acc.update(good(3, 4))
    with pytest.raises(ValueError, match="expected dim"):
        df.StreamingCovariance(4).load_state_dict(acc.state_dict())
    bad = acc.state_dict() | {"mean": torch.full((5,), float("nan"), dtype=torch.float64)}
    with pytest.raises(ValueError, match="corrupt"):
        df.StreamingCovariance(5).load_state_dict(bad)
    with pytest.raises(ValueError, match="no rows"):
        _ = df.StreamingCovariance(5).covariance
    with pytest.raises(ValueError, match="dim"):
        df.StreamingCovariance(0)
    empty = df.StreamingCovariance(5).update(np.zeros((0, 5)))
    assert empty.count == 0


def numpy_state(acc: df.StreamingCovariance) -> dict[str, np.ndarray]:
    """The state as NumPy arrays, the form earlier versions saved (still loaded)."""
    return {name: value.numpy() for name, value in acc.state_dict().items()}


def _cuda_reason() -> str:
    entry = df.build_info()["backends"]["cuda"]
    if not entry["available"]:
        return f"CUDA backend not usable here: {entry['reason'] or 'not compiled'}"
    return "" if torch.cuda.is_available() else "torch has no CUDA device"


@pytest.mark.gpu
@pytest.mark.skipif(bool(_cuda_reason()), reason=_cuda_reason() or "CUDA available")
def test_streaming_covariance_keeps_cuda_batches_on_the_device():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(2000, 48)) + 3
    acc = df.StreamingCovariance(48)
    for chunk in np.array_split(X, 3):
        acc.update(torch.from_numpy(chunk).float().cuda())
    assert acc._comoment.is_cuda
    want = np.cov(X.astype(np.float32).astype(np.float64), rowvar=False, bias=True)
    assert np.abs(acc.covariance - want).max() <= 1e-5 * np.abs(want).max()
    host = df.StreamingCovariance(48).update(X[:10])
    acc.merge(host)  # mixing device and host accumulators
    assert acc.count == 2010


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda s: {"comoment": s["comoment"] + np.triu(np.ones((5, 5)), 1)}, "comoment"),  # asymmetric
        (lambda s: {"count": np.array(3.7)}, "count"),  # fractional
        (lambda s: {"count": np.array(-1)}, "count"),
        (lambda s: {"count": np.array([100, 100])}, "count"),  # not a scalar
        (lambda s: {"count": np.array(0)}, "count"),  # no rows but a non-zero mean and co-moment
        (lambda s: {"dim": np.array(6)}, "dim"),  # disagrees with the arrays and the accumulator
        (lambda s: {"mean": s["mean"].astype(np.complex128)}, "mean"),
        (
            lambda s: {"comoment": s["comoment"] - 2 * np.diag(np.diag(s["comoment"]))},
            "comoment",
        ),  # negative sums of squares
        (lambda s: {"comoment": np.full((5, 5), np.inf)}, "comoment"),
        (lambda s: {"mean": s["mean"][:4]}, "mean"),
        (lambda s: {"mean": np.full(5, np.nan)}, "mean"),
        (lambda s: {"comoment": s["comoment"][:4, :4]}, "comoment"),
        (lambda s: {"count": np.array(2**64, dtype=np.float64)}, "count"),
        (lambda s: {"count": np.array(1)}, "count"),  # one row has no spread: the co-moment must be zero
        # |c01| > sqrt(c00 c11): symmetric with a positive diagonal, yet no data has this co-moment
        (
            lambda s: {
                "comoment": np.diag(np.diag(s["comoment"]))
                + 2 * np.sqrt(np.outer(np.diag(s["comoment"]), np.diag(s["comoment"]))) * (1 - np.eye(5))
            },
            "comoment",
        ),
    ],
)
def test_streaming_covariance_refuses_corrupt_states_naming_the_field(change, field):
    state = numpy_state(df.StreamingCovariance(5).update(good(50, 5)))
    target = df.StreamingCovariance(5).update(good(7, 5))
    before = target.state_dict()
    with pytest.raises(ValueError, match=f"'{field}'"):
        target.load_state_dict(state | change(state))
    after = target.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)  # a refused state changes nothing


@pytest.mark.parametrize(
    "layout, tolerance",
    [
        (np.asfortranarray, 1e-12),
        (lambda a: a.astype(np.float32), 1e-6),
        (lambda a: np.repeat(a, 2, axis=-1)[..., ::2], 1e-12),  # a non-contiguous view
        (lambda a: torch.from_numpy(np.ascontiguousarray(a)), 1e-12),
        (lambda a: torch.from_numpy(np.ascontiguousarray(a)).T.contiguous().T, 1e-12),  # a column-major tensor
        (lambda a: a.astype(">f8"), 1e-12),  # big-endian
    ],
)
def test_streaming_covariance_state_of_any_layout_keeps_updating_exactly(layout, tolerance):
    """A saved state in another layout is converted (issue 21: a Fortran-ordered one was loaded, then never updated)."""
    first, second = good(50, 5), good(70, 5) * 3 + 1
    state = numpy_state(df.StreamingCovariance(5).update(first))
    state = {k: (layout(v) if v.ndim else v) for k, v in state.items()}
    restored = df.StreamingCovariance(5).load_state_dict(state).update(second)
    want = np.cov(np.vstack([first, second]), rowvar=False, bias=True)
    assert np.abs(restored.covariance - want).max() <= tolerance * np.abs(want).max()
    assert restored.count == 120


def test_streaming_covariance_loads_whole_float_counts_and_states_without_dim():
    acc = df.StreamingCovariance(5).update(good(50, 5))
    state = numpy_state(acc)
    del state["dim"]
    restored = df.StreamingCovariance(5).load_state_dict(state | {"count": np.array(50.0)})
    assert restored.count == 50 and isinstance(restored.count, int)
    np.testing.assert_array_equal(restored.covariance, acc.covariance)
    assert df.StreamingCovariance(5).load_state_dict(df.StreamingCovariance(5).state_dict()).count == 0
