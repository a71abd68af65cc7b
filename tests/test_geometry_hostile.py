"""The geometry API under hostile or unusual input: numbers right at any scale a dtype holds, or one refusal
naming the argument; states that round-trip through torch's safe loader; types a user's mypy can see."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dihal_fast as df
from dihal_fast import reference as ref
from dihal_fast.errors import DihalTypeError, DihalValueError


def rows(n: int, D: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 6)) @ rng.standard_normal((6, D)) + 0.1 * rng.standard_normal((n, D)) + 2.0


# --- inputs ---------------------------------------------------------------------------------------------


def test_ml_dtypes_bfloat16_arrays_are_accepted():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (a test dependency) is not installed")
    X = rows(40, 7).astype(ml_dtypes.bfloat16)
    as_float = X.astype(np.float32)  # the bfloat16 values, exactly
    assert df.effective_rank(X) == pytest.approx(ref.effective_rank(as_float), rel=1e-10)
    idx, d2 = df.knn(X, 3)
    np.testing.assert_array_equal(idx, ref.knn(as_float, 3)[0])
    acc = df.StreamingCovariance(7).update(X)
    want = np.cov(as_float.astype(np.float64), rowvar=False, bias=True)
    assert np.abs(acc.covariance - want).max() <= 1e-6 * np.abs(want).max()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: torch.zeros(10, 3, device="meta"), "'meta' device"),
        (lambda: torch.eye(10, 3).to_sparse(), "sparse_coo tensor"),
    ],
)
def test_unsupported_tensors_are_one_refusal_naming_the_argument(make, message):
    X = make()
    for call in (
        lambda: df.knn(X, 2),
        lambda: df.geometry_proxies(X, k=2),
        lambda: df.StreamingCovariance(3).update(X),
    ):
        with pytest.raises(DihalValueError, match=f"^X is a .*{message}"):
            call()


# --- StreamingCovariance: scale, state ------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1e-37, 1e-30, 1e-22, 1e-10, 1.0, 1e10, 1e19, 1e30, 1e37])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_low_precision_covariance_is_right_at_any_scale_the_dtype_holds(dtype, scale):
    """float32/bf16 blocks are scaled before their float32 SYRK: no inf at 1e19, no negative variance at 1e-22,
    and the state saved at that scale loads back."""
    base = rows(300, 6, seed=2)
    X32 = (base * scale).astype(np.float32)
    X = torch.from_numpy(X32).to(torch.bfloat16) if dtype == "bfloat16" else X32
    values = ref.to_float64(X)
    acc = df.StreamingCovariance(6)
    for part in (X[:7], X[7:150], X[150:]):
        acc.update(part)
    want = np.cov(values, rowvar=False, bias=True)
    got = acc.covariance
    assert np.isfinite(got).all() and (np.diag(got) > 0).all()
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()
    restored = df.StreamingCovariance(6).load_state_dict(acc.state_dict())
    np.testing.assert_array_equal(restored.covariance, got)


def test_state_dict_loads_with_torch_weights_only_and_old_numpy_states_still_load():
    acc = df.StreamingCovariance(5).update(rows(60, 5))
    buffer = io.BytesIO()
    torch.save(acc.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    restored = df.StreamingCovariance(5).load_state_dict(state)
    np.testing.assert_array_equal(restored.covariance, acc.covariance)
    assert restored.count == 60
    old = {name: value.numpy() for name, value in acc.state_dict().items()}  # the NumPy states of 0.x
    np.testing.assert_array_equal(df.StreamingCovariance(5).load_state_dict(old).covariance, acc.covariance)


@pytest.mark.parametrize(
    "state, error, message",
    [
        (None, DihalTypeError, "mapping"),
        ([1, 2], DihalTypeError, "mapping"),
        ("mean", DihalTypeError, "mapping"),
    ],
)
def test_load_state_dict_refuses_what_is_not_a_state(state, error, message):
    with pytest.raises(error, match=message):
        df.StreamingCovariance(3).load_state_dict(state)


@pytest.mark.parametrize("mean", [1e200, -1e101])
def test_load_state_dict_refuses_means_no_batch_can_have(mean):
    state = df.StreamingCovariance(2).update(rows(5, 2)).state_dict()
    state["mean"] = torch.tensor([mean, 0.0], dtype=torch.float64)
    with pytest.raises(DihalValueError, match="'mean' has values up to"):
        df.StreamingCovariance(2).load_state_dict(state)


def test_load_state_dict_refuses_a_meta_tensor_field():
    state = df.StreamingCovariance(2).update(rows(5, 2)).state_dict()
    state["mean"] = torch.zeros(2, device="meta")
    with pytest.raises(DihalValueError, match="'mean' is a meta tensor"):
        df.StreamingCovariance(2).load_state_dict(state)


# --- m_mono at any allowed ridge ------------------------------------------------------------------------


@pytest.mark.parametrize("ridge", [1e-6, 1e-3, 1.0, 1e3, 1e9, 1e15, 1e100, 1e300])
@pytest.mark.parametrize("n, D", [(20, 50), (37, 129), (64, 65)])
def test_monotonicity_with_fewer_rows_than_features_matches_the_reference_at_any_ridge(n, D, ridge):
    X = rows(n, D, seed=n)
    got = df.monotonicity_proxy(X, ridge=ridge, n_pairs=300)
    assert got == pytest.approx(ref.monotonicity_proxy(X, ridge=ridge, n_pairs=300), rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(3, 40),
    extra=st.integers(1, 40),
    log_ridge=st.floats(-6, 300),
    seed=st.integers(0, 2**31),
)
def test_monotonicity_gram_route_fuzz(n, extra, log_ridge, seed):
    X = np.random.default_rng(seed).standard_normal((n, n + extra))
    ridge = 10.0**log_ridge
    got = df.monotonicity_proxy(X, ridge=ridge, n_pairs=50, seed=seed)
    assert got == pytest.approx(ref.monotonicity_proxy(X, ridge=ridge, n_pairs=50, seed=seed), rel=1e-8)


@pytest.mark.parametrize("ridge", [1e-7, 1e301, 1e308])
def test_ridge_outside_the_stated_range_is_one_refusal(ridge):
    with pytest.raises(DihalValueError, match=r"ridge must lie in \[1e-06, 1e\+300\]"):
        df.monotonicity_proxy(rows(20, 5), ridge=ridge)


# --- kNN distances at extreme float32 scales ------------------------------------------------------------


@pytest.mark.parametrize("scale", [1e-30, 1e-20, 1e19, 1e30])
def test_float32_knn_distances_neither_underflow_nor_overflow(scale):
    X = (rows(41, 5, seed=3) * scale).astype(np.float32)
    idx, d2 = df.knn(X, 4)
    ridx, rd2 = ref.knn(X, 4)  # float64 distances of the same float32 values
    np.testing.assert_array_equal(idx, ridx)
    assert d2.dtype == np.float64 and (d2 > 0).all() and np.isfinite(d2).all()
    np.testing.assert_allclose(d2, rd2, rtol=1e-12)


# --- loose types ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "seed, error",
    [
        (True, DihalTypeError),
        (1.5, DihalTypeError),
        ("3", DihalTypeError),
        (np.float64(2.0), DihalTypeError),
        (-5, DihalValueError),
        (2**63, DihalValueError),
    ],
)
def test_seeds_must_be_integers(seed, error):
    for call in (df.monotonicity_proxy, lambda X, seed: df.geometry_proxies(X, k=2, seed=seed)):
        with pytest.raises(error, match="seed must"):
            call(rows(20, 4), seed=seed)


def test_numpy_integer_seeds_are_the_same_seed():
    X = rows(30, 4)
    assert df.monotonicity_proxy(X, seed=np.int64(7)) == df.monotonicity_proxy(X, seed=7)


@pytest.mark.parametrize("n_pairs", [2**63, 1e30])
def test_huge_pair_counts_are_one_line_not_overflow_error(n_pairs):
    with pytest.raises(DihalValueError, match="n_pairs must be below 2\\*\\*63"):
        df.monotonicity_proxy(rows(20, 4), n_pairs=n_pairs)


@pytest.mark.parametrize("value", ["1", b"1", True, None, [1.0]])
def test_selection_scores_refuse_proxies_that_are_not_numbers(value):
    good = {"m_curv": 1.0, "m_mono": 2.0, "k_eff": 3.0}
    with pytest.raises(DihalTypeError, match="layer 1: m_curv must be a number"):
        df.selection_scores({1: {**good, "m_curv": value}, 2: good})


def test_selection_scores_refuse_a_layer_that_is_not_a_mapping():
    with pytest.raises(DihalTypeError, match="layer 1: the proxies must be a mapping"):
        df.selection_scores({1: 5, 2: {"m_curv": 1.0, "m_mono": 2.0, "k_eff": 3.0}})


# --- typing ---------------------------------------------------------------------------------------------


def test_the_package_carries_py_typed():
    """PEP 561: without the marker a user's mypy treats the installed package as untyped."""
    assert (Path(df.__file__).parent / "py.typed").is_file()


@pytest.mark.slow
def test_a_users_mypy_checks_calls_against_the_signatures(tmp_path):
    """A user's mypy sees the geometry signatures (here: k given a string)."""
    pytest.importorskip("mypy", reason="mypy (a test dependency) is not installed")
    package = Path(df.__file__).parent
    user = tmp_path / "user.py"
    user.write_text(
        textwrap.dedent(
            """
            import numpy as np
            import dihal_fast.geometry as g

            idx, d2 = g.knn(np.zeros((4, 2), dtype=np.float32), k="3")
            """
        )
    )
    config = tmp_path / "mypy.ini"
    config.write_text(
        "[mypy]\nfollow_imports = silent\n"
        "[mypy-torch.*,transformers.*,safetensors.*,nvtx.*,tqdm.*,matplotlib.*]\n"
        "follow_imports = skip\nignore_missing_imports = True\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--config-file", str(config), str(user)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(package.parent)},
    )
    assert 'Argument "k" to "knn" has incompatible type "str"; expected "int"' in result.stdout, result.stdout
