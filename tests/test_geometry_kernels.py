"""Compiled kernels against the NumPy float64 reference, on fresh random inputs of every kind."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import dihal_fast as df
from dihal_fast import reference as ref

BACKENDS = ["cpu", "reference"]


def low_rank(n: int, D: int, rank: int = 6, noise: float = 0.05, seed: int = 0, offset: float = 3.0) -> np.ndarray:
    """Low-rank-plus-noise rows with a large common offset (like hidden states)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, rank)) @ rng.normal(size=(rank, D)) + noise * rng.normal(size=(n, D))
    return X + offset * rng.normal(size=D)


def as_dtype(X: np.ndarray, dtype: str):
    """``X`` rounded to ``dtype``: NumPy for float16/32/64, a torch tensor for bfloat16."""
    if dtype == "bfloat16":
        return torch.from_numpy(X).to(torch.bfloat16)
    return X.astype(dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("n,D,k", [(257, 33, 16), (90, 7, 5), (40, 129, 1)])
def test_knn_matches_reference(dtype, n, D, k):
    X = as_dtype(low_rank(n, D, seed=n + D), dtype)
    idx, d2 = df.knn(X, k)
    ridx, rd2 = ref.knn(X, k)
    np.testing.assert_array_equal(idx, ridx)
    assert d2.dtype == (np.float64 if dtype == "float64" else np.float32)
    np.testing.assert_allclose(d2, rd2, rtol=1e-6 if dtype != "float64" else 1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_knn_rowwise_and_symmetric_passes_agree(dtype):
    """The two candidate passes of the C++ kernel (block-symmetric and row-wise) give the reference."""
    core = pytest.importorskip("dihal_fast._core")
    X = low_rank(1300, 20, seed=11).astype(dtype)  # several 512-row blocks, ragged last block
    ridx, rd2 = ref.knn(X, 7)
    for symmetric in (True, False):
        idx, d2 = core.knn(X, 7, symmetric)
        np.testing.assert_array_equal(idx, ridx)
        np.testing.assert_allclose(d2, rd2, rtol=1e-12)


def test_knn_duplicate_rows_ties_to_lower_index():
    rng = np.random.default_rng(1)
    base = rng.normal(size=(30, 12))
    X = np.concatenate([base, base[:10], base[:10], base[:5]]).astype(np.float32)  # many exact ties
    rng.shuffle(X)
    idx, d2 = df.knn(X, 4)
    ridx, rd2 = ref.knn(X, 4)
    np.testing.assert_array_equal(idx, ridx)
    np.testing.assert_array_equal(d2, rd2.astype(np.float32))


def test_knn_large_offset_small_gaps():
    """Clusters far from the origin with tiny within-cluster gaps: float32 GEMM alone would misorder."""
    rng = np.random.default_rng(2)
    centres = 1e3 * rng.normal(size=(20, 64))
    X = (np.repeat(centres, 25, axis=0) + 1e-2 * rng.normal(size=(500, 64))).astype(np.float32)
    np.testing.assert_array_equal(df.knn(X, 8)[0], ref.knn(X, 8)[0])


@pytest.mark.parametrize("layout", ["strided", "fortran", "torch_strided", "torch_transposed"])
def test_non_contiguous_inputs(layout):
    X = low_rank(120, 40, seed=3)
    view = {
        "strided": lambda: X[::2, ::2],
        "fortran": lambda: np.asfortranarray(X),
        "torch_strided": lambda: torch.from_numpy(X)[1::2, ::3],
        "torch_transposed": lambda: torch.from_numpy(np.ascontiguousarray(X.T)).T,
    }[layout]()
    dense = ref.to_float64(view)
    np.testing.assert_array_equal(df.knn(view, 6)[0], ref.knn(dense, 6)[0])
    got, want = df.geometry_proxies(view, k=6, n_pairs=500), ref.geometry_proxies(dense, k=6, n_pairs=500)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-9)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_geometry_proxies_match_reference(dtype, backend):
    X = as_dtype(low_rank(300, 48, seed=4), dtype)
    got = df.geometry_proxies(X, k=16, n_pairs=2000, seed=7, backend=backend)
    want = ref.geometry_proxies(X, k=16, n_pairs=2000, seed=7)
    assert set(got) == {"m_curv", "m_mono", "k_eff"}
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-9), key


def test_single_proxies_agree_with_combined():
    X = low_rank(200, 30, seed=5).astype(np.float32)
    combined = df.geometry_proxies(X, k=8, ridge=1e-2, n_pairs=1000, seed=3)
    assert df.curvature_proxy(X, k=8) == pytest.approx(combined["m_curv"], rel=1e-12)
    assert df.monotonicity_proxy(X, ridge=1e-2, n_pairs=1000, seed=3) == pytest.approx(combined["m_mono"], rel=1e-12)
    assert df.effective_rank(X) == pytest.approx(combined["k_eff"], rel=1e-12)


def test_duplicate_rows_give_finite_proxies():
    rng = np.random.default_rng(6)
    X = np.repeat(rng.normal(size=(10, 16)), 20, axis=0)  # every neighbourhood is one point: lambda = 0
    got = df.geometry_proxies(X, k=16, n_pairs=3000)
    want = ref.geometry_proxies(X, k=16, n_pairs=3000)
    assert all(np.isfinite(v) and v > 0 for v in got.values())
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-9)


def test_rank_one_data():
    rng = np.random.default_rng(7)
    X = np.outer(rng.normal(size=150), rng.normal(size=20))
    assert df.effective_rank(X) == pytest.approx(1.0, rel=1e-9)
    assert df.geometry_proxies(X, k=4)["k_eff"] == pytest.approx(ref.effective_rank(X), rel=1e-9)


def test_top_eigenvalue_small_and_lanczos():
    core = pytest.importorskip("dihal_fast._core")
    rng = np.random.default_rng(8)
    for m in (1, 2, 5, 17, 40):
        A = rng.normal(size=(m, m))
        A = A + A.T
        assert core.top_eigenvalue_small(A) == pytest.approx(np.linalg.eigvalsh(A)[-1], rel=1e-12, abs=1e-12)
    # Clustered top of the spectrum: Lanczos must still converge to the largest.
    Q, _ = np.linalg.qr(rng.normal(size=(200, 200)))
    ev = np.concatenate([[10.0, 10.0 - 1e-6, 9.9], rng.uniform(0, 5, size=197)])
    S = (Q * ev) @ Q.T
    value, iterations = core.top_eigenvalue_psd(S)
    assert value == pytest.approx(10.0, rel=1e-10)
    assert 1 <= iterations <= 200


@given(
    n=st.integers(2, 40),
    D=st.integers(1, 24),
    k_frac=st.floats(0, 1),
    dtype=st.sampled_from(["float32", "float64"]),
    seed=st.integers(0, 2**16),
)
def test_property_knn_and_proxies(n, D, k_frac, dtype, seed):
    k = 1 + int(k_frac * (n - 2))
    X = np.random.default_rng(seed).normal(size=(n, D)).astype(dtype)
    idx, d2 = df.knn(X, k)
    ridx, rd2 = ref.knn(X, k)
    assert idx.shape == (n, k) and idx.dtype == np.int64
    np.testing.assert_array_equal(idx, ridx)  # continuous random data: no exact ties
    np.testing.assert_allclose(d2, rd2, rtol=1e-6, atol=1e-12)
    got = df.geometry_proxies(X, k=k, n_pairs=200, seed=seed)
    want = ref.geometry_proxies(X, k=k, n_pairs=200, seed=seed)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-7), key


def _hidden_states(model_dir, texts: list[str]) -> list[np.ndarray]:
    """Every layer's hidden states (padding and the first position dropped) of a local checkpoint."""
    from dihal_fast.common.models import load_causal_lm

    model, tokenizer = load_causal_lm(model_dir)
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    keep = batch["attention_mask"].bool().clone()
    keep[:, 0] = False
    return [h[keep].numpy() for h in out.hidden_states]


@pytest.fixture(scope="module")
def real_text(shared_data) -> list[str]:
    text = (shared_data / "text" / "tinystories.valid.txt").read_text().split("\n\n")
    return [t for t in text if len(t) > 200][:12]


def test_proxies_on_hidden_states_of_a_transformers_model(tiny_checkpoints, real_text):
    """Kernels against the reference on real activations: the shipped backbone when present, else a tiny Llama."""
    from dihal_fast.backbone import DEFAULT_MODEL_DIR

    model_dir = DEFAULT_MODEL_DIR if (DEFAULT_MODEL_DIR / "config.json").is_file() else tiny_checkpoints["llama"]
    layers = _hidden_states(model_dir, real_text)
    assert len(layers) >= 3
    for H in (layers[1], layers[-1]):
        H = H[:400]
        np.testing.assert_array_equal(df.knn(H, 16)[0], ref.knn(H, 16)[0])
        got = df.geometry_proxies(H, n_pairs=3000)
        want = ref.geometry_proxies(H, n_pairs=3000)
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-8), key
        half = torch.from_numpy(H).to(torch.bfloat16)
        got16 = df.geometry_proxies(half, n_pairs=3000)
        want16 = ref.geometry_proxies(half, n_pairs=3000)
        for key in want16:
            assert got16[key] == pytest.approx(want16[key], rel=1e-8), key
