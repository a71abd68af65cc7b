"""Collection: streamed statistics against hidden states computed directly, reservoir sampling,
padding/first-position masks, checkpoint + resume, and merging across (virtual) ranks."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from scipy import stats as scipy_stats

from dihal_fast import geometry_proxies, selection_scores
from dihal_fast.collect import (
    CollectConfig,
    LayerStatistics,
    TokenReservoir,
    collect,
    model_hidden_states,
    token_keys,
    token_mask,
)
from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.corpus import read_texts, token_blocks
from dihal_fast.select import estimate_geometry, subsample

TEXT = (
    "The quick brown fox jumps over the lazy dog. Once upon a time there was a little girl who loved books.\n\n"
    "It is a truth universally acknowledged, that a single man in possession of a good fortune must be in want "
    "of a wife. Numbers like 12, 345 and 6789 appear in text too; so do symbols: #, $, %, &.\n\n"
)
SEQ_LEN, BATCH = 24, 3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text(TEXT * 30)
    return path


def _config(model, corpus, **overrides) -> CollectConfig:
    settings = dict(
        model=str(model),
        corpus=[str(corpus)],
        seq_len=SEQ_LEN,
        batch_size=BATCH,
        max_tokens=SEQ_LEN * 20,
        reservoir_size=150,
        checkpoint_every=2,
    )
    settings.update(overrides)
    return CollectConfig(**settings)


def _reference_hidden_states(model_dir, config: CollectConfig) -> list[np.ndarray]:
    """``hidden[layer]``: ``n_blocks x seq x D`` float64 from the full model's ``output_hidden_states``, block by
    block."""
    model, tokenizer = load_causal_lm(model_dir)
    blocks = token_blocks(tokenizer, read_texts(config.corpus), config.seq_len, config.max_tokens)
    with torch.no_grad():
        per_block = [model(input_ids=b[None], output_hidden_states=True).hidden_states for b in blocks]
    return [np.concatenate([h[layer].double().numpy() for h in per_block]) for layer in range(len(per_block[0]))]


# --------------------------------------------------------------------------- reservoir (no model)


def _bottom(keys: np.ndarray, n: int) -> np.ndarray:
    return np.sort(np.argsort(keys, kind="stable")[:n])


@given(
    n_tokens=st.integers(1, 300),
    capacity=st.integers(1, 80),
    cuts=st.lists(st.integers(0, 300), max_size=8),
    seed=st.integers(0, 2**40),
)
def test_reservoir_keeps_smallest_keys_whatever_the_batches(n_tokens, capacity, cuts, seed):
    positions = np.arange(n_tokens, dtype=np.int64) * 7 + 3
    keys = token_keys(positions, seed)
    vectors = torch.randn(n_tokens, 5)
    reservoir = TokenReservoir(capacity, layers=[0, 2], dim=5)
    bounds = [0, *sorted(c for c in cuts if c < n_tokens), n_tokens]
    for a, b in zip(bounds[:-1], bounds[1:]):
        reservoir.offer(keys[a:b], positions[a:b], positions[a:b] + 1, {0: vectors[a:b], 2: 2 * vectors[a:b]})
    out = reservoir.sorted()
    expected = _bottom(keys, capacity)
    assert out.size == min(capacity, n_tokens)
    assert np.array_equal(np.sort(out.positions[: out.size]), positions[expected])
    rows = (out.positions[: out.size] - 3) // 7
    assert np.array_equal(out.token_ids[: out.size], out.positions[: out.size] + 1)
    assert torch.equal(out.layer_vectors(0), vectors[rows])
    assert torch.equal(out.layer_vectors(2), 2 * vectors[rows])
    keys = out.keys[: out.size]
    assert np.all(keys[1:] > keys[:-1])  # key order


@given(
    n_tokens=st.integers(2, 200), capacity=st.integers(1, 60), share=st.lists(st.booleans(), min_size=200, max_size=200)
)
def test_reservoir_merge_equals_single_pass(n_tokens, capacity, share):
    positions = np.arange(n_tokens, dtype=np.int64)
    keys = token_keys(positions, 5)
    vectors = torch.randn(n_tokens, 3)
    single, a, b = (TokenReservoir(capacity, [1], 3) for _ in range(3))
    single.offer(keys, positions, positions, {1: vectors})
    mine = np.array(share[:n_tokens])
    a.offer(keys[mine], positions[mine], positions[mine], {1: vectors[torch.from_numpy(mine)]})
    b.offer(keys[~mine], positions[~mine], positions[~mine], {1: vectors[torch.from_numpy(~mine)]})
    merged, single = a.merge(b).sorted(), single.sorted()
    assert np.array_equal(merged.positions[: merged.size], single.positions[: single.size])
    assert torch.equal(merged.layer_vectors(1), single.layer_vectors(1))


def test_token_keys_are_distinct_seeded_and_uniform():
    positions = np.arange(200_000, dtype=np.int64)
    keys = token_keys(positions, seed=3)
    assert np.unique(keys).size == keys.size
    assert np.array_equal(keys, token_keys(positions, seed=3))
    assert not np.array_equal(keys, token_keys(positions, seed=4))
    uniform = keys.astype(np.float64) / 2.0**64
    assert scipy_stats.kstest(uniform, "uniform").pvalue > 1e-3
    # the bottom-n sample is spread evenly over the stream (no positional bias)
    sample = _bottom(keys, 20_000)
    counts = np.bincount(sample * 10 // positions.size, minlength=10)
    assert scipy_stats.chisquare(counts).pvalue > 1e-3


def test_reservoir_state_round_trip_and_checks():
    res = TokenReservoir(10, [0, 1], 4)
    pos = np.arange(25, dtype=np.int64)
    res.offer(token_keys(pos, 0), pos, pos, {0: torch.randn(25, 4), 1: torch.randn(25, 4)})
    again = TokenReservoir(10, [0, 1], 4).load_state_dict(res.state_dict())
    assert np.array_equal(again.keys[:10], res.keys[:10])
    assert torch.equal(again.layer_vectors(1), res.layer_vectors(1))
    with pytest.raises(ValueError, match="does not fit"):
        TokenReservoir(5, [0, 1], 4).load_state_dict(res.state_dict())
    with pytest.raises(ValueError, match="missing"):
        TokenReservoir(10, [0, 1, 2], 4).load_state_dict(res.state_dict())


# --------------------------------------------------------------------------- masks and statistics (no model)


def test_token_mask_excludes_padding_and_first_real_token():
    attention = torch.tensor([[1, 1, 1, 0], [0, 0, 1, 1], [0, 0, 0, 0]])
    assert token_mask(attention, keep_first=False).tolist() == [
        [False, True, True, False],
        [False, False, False, True],
        [False, False, False, False],
    ]
    assert torch.equal(token_mask(attention, keep_first=True), attention.bool())


def test_statistics_merge_of_rank_shares_equals_one_stream():
    # float64 hidden states: the kernel then works in float64 throughout, so merge == one stream to 1e-12
    rng = torch.Generator().manual_seed(0)
    blocks = [torch.randn(3, 6, 8, generator=rng, dtype=torch.float64) for _ in range(7)]  # layers x seq x D

    def feed(stats, block_ids):
        for b in block_ids:
            hidden = [blocks[b][l][None] for l in range(3)]
            positions = (b * 6 + torch.arange(6))[None]
            stats.update(hidden, token_mask(torch.ones(1, 6), False), positions, positions)

    whole, rank0, rank1 = (
        LayerStatistics(range(3), 8, reservoir_size=12, dtype=torch.float64, seed=1) for _ in range(3)
    )
    feed(whole, range(7))
    feed(rank0, range(0, 7, 2))
    feed(rank1, range(1, 7, 2))
    merged = rank0.merge(rank1)
    assert merged.count == whole.count == 7 * 5
    for layer in range(3):
        np.testing.assert_allclose(
            merged.covariances[layer].covariance, whole.covariances[layer].covariance, rtol=1e-12, atol=1e-12
        )
        rows = torch.cat([blocks[b][layer][1:] for b in range(7)]).numpy()
        np.testing.assert_allclose(
            whole.covariances[layer].covariance, np.cov(rows.T, bias=True), rtol=1e-12, atol=1e-12
        )
    a, b = merged.reservoir.sorted(), whole.reservoir.sorted()
    assert np.array_equal(a.positions[:12], b.positions[:12])
    assert torch.equal(a.layer_vectors(2), b.layer_vectors(2))


# --------------------------------------------------------------------------- with models


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2"])
def test_streamed_statistics_match_direct_hidden_states(tiny_checkpoints, corpus, tmp_path, family):
    model_dir = tiny_checkpoints[family]
    config = _config(model_dir, corpus)
    result = collect(config, tmp_path / "run", progress=False)
    assert result.complete and result.n_blocks == 20
    hidden = _reference_hidden_states(model_dir, config)
    stats = result.statistics
    assert len(hidden) == result.n_layers + 1 == len(stats.layers)
    assert stats.count == result.n_tokens == 20 * (SEQ_LEN - 1)
    for layer, h in enumerate(hidden):
        rows = h[:, 1:].reshape(-1, h.shape[-1])  # first position excluded
        scale = np.abs(rows).max() ** 2
        np.testing.assert_allclose(stats.covariances[layer].mean, rows.mean(0), rtol=1e-5, atol=1e-6 * np.sqrt(scale))
        np.testing.assert_allclose(
            stats.covariances[layer].covariance, np.cov(rows.T, bias=True), rtol=1e-4, atol=1e-6 * scale
        )

    # the reservoir holds the smallest-key tokens, with exactly their hidden states
    reservoir = stats.reservoir.sorted()
    all_positions = (np.arange(20)[:, None] * SEQ_LEN + np.arange(1, SEQ_LEN)).ravel()
    expected = all_positions[_bottom(token_keys(all_positions, config.seed), config.reservoir_size)]
    assert np.array_equal(np.sort(reservoir.positions[: reservoir.size]), expected)
    block, offset = np.divmod(reservoir.positions[: reservoir.size], SEQ_LEN)
    for layer, h in enumerate(hidden):
        np.testing.assert_allclose(
            reservoir.layer_vectors(layer).double().numpy(), h[block, offset], rtol=1e-5, atol=1e-5
        )

    # proxies from the reservoir == geometry_proxies on the directly computed vectors at the same rows
    layers = list(range(1, result.n_layers))
    estimate = estimate_geometry(
        {l: reservoir.layer_vectors(l) for l in layers}, layers, repeats=2, sample_size=100, k=8, n_pairs=500
    )
    for r in range(2):
        rows, pair_seed = subsample(reservoir.size, 100, 0, r)
        direct = {
            l: geometry_proxies(hidden[l][block[rows], offset[rows]], k=8, n_pairs=500, seed=pair_seed) for l in layers
        }
        scores, _ = selection_scores(direct)
        for i, l in enumerate(layers):
            for name in ("m_curv", "m_mono", "k_eff"):
                assert estimate.values[name][r, i] == pytest.approx(direct[l][name], rel=1e-4)
            assert estimate.values["score"][r, i] == pytest.approx(scores[l], rel=1e-3, abs=1e-4)


def test_padding_is_excluded(tiny_checkpoints):
    model, tokenizer = load_causal_lm(tiny_checkpoints["llama"])
    long, short = torch.randint(3, 300, (10,)), torch.randint(3, 300, (6,))
    padded = torch.full((2, 10), tokenizer.pad_token_id)
    padded[0], padded[1, :6] = long, short
    attention = (torch.arange(10) < torch.tensor([[10], [6]])).long()
    positions = torch.arange(20).reshape(2, 10)
    batched, separate = (LayerStatistics(range(5), 32, reservoir_size=50) for _ in range(2))
    batched.update(
        model_hidden_states(model.base_model, padded, attention), token_mask(attention, False), positions, padded
    )
    for row, ids in enumerate((long, short)):
        ones = torch.ones(1, ids.numel(), dtype=torch.long)
        separate.update(
            model_hidden_states(model.base_model, ids[None], ones),
            token_mask(ones, False),
            positions[row : row + 1, : ids.numel()],
            ids[None],
        )
    assert batched.count == separate.count == 9 + 5
    for layer in range(5):
        np.testing.assert_allclose(
            batched.covariances[layer].covariance, separate.covariances[layer].covariance, rtol=1e-4, atol=1e-6
        )
    assert np.array_equal(np.sort(batched.reservoir.positions[:14]), np.sort(separate.reservoir.positions[:14]))


def test_killed_midway_and_resumed_equals_uninterrupted(tiny_checkpoints, corpus, tmp_path):
    config = _config(tiny_checkpoints["qwen3"], corpus)
    whole = collect(config, tmp_path / "whole", progress=False)
    first = collect(config, tmp_path / "parts", max_batches=3, progress=False)
    assert not first.complete and first.statistics is None and first.n_blocks == 3 * BATCH
    second = collect(config, tmp_path / "parts", resume=True, max_batches=2, progress=False)
    assert not second.complete and second.n_blocks == 5 * BATCH
    final = collect(config, tmp_path / "parts", resume=True, progress=False)
    assert final.complete and final.n_blocks == whole.n_blocks and final.n_tokens == whole.n_tokens
    a, b = final.statistics.state_dict(), whole.statistics.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name  # bit-identical: the same updates in the same order


def test_resume_checks_the_run_directory(tiny_checkpoints, corpus, tmp_path):
    config = _config(tiny_checkpoints["llama"], corpus)
    with pytest.raises(FileNotFoundError, match="collection config to resume"):
        collect(config, tmp_path / "none", resume=True, progress=False)
    collect(config, tmp_path / "run", max_batches=1, progress=False)
    with pytest.raises(ValueError, match="already holds a collection, with this configuration; .*resume=True"):
        collect(config, tmp_path / "run", progress=False)
    with pytest.raises(ValueError, match=r"already holds a collection, its configuration differs \(.*seq_len"):
        collect(_config(tiny_checkpoints["llama"], corpus, seq_len=16), tmp_path / "run", progress=False)
    with pytest.raises(ValueError, match="configuration changed.*seq_len"):
        collect(_config(tiny_checkpoints["llama"], corpus, seq_len=16), tmp_path / "run", resume=True, progress=False)
    part = next((tmp_path / "run" / "collect").glob("state-rank0000-of-0001.parts-*/cov-1.safetensors"))
    part.write_bytes(part.read_bytes()[:100])
    with pytest.raises(ValueError, match="corrupt.*cov-1.safetensors is missing or not the"):
        collect(config, tmp_path / "run", resume=True, progress=False)


MANIFEST = "state-rank0000-of-0001.json"  # rank 0 of 1's checkpoint manifest in RUN/collect


def _read_checkpoint(run) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors of every part of rank 0's streamed checkpoint in ``run`` and its progress."""
    manifest = json.loads((run / "collect" / MANIFEST).read_text())
    tensors = {}
    for name in manifest["files"]:
        tensors.update(load_file(run / "collect" / manifest["parts"] / name))
    return tensors, manifest["progress"]


def _rewrite_checkpoint(run, tensors: dict[str, torch.Tensor], progress: dict) -> None:
    """Write (edited) ``tensors`` back into the parts they came from and ``progress`` into the manifest, with the
    new part sizes: what a careful hand-editor of the checkpoint would do."""
    path = run / "collect" / MANIFEST
    manifest = json.loads(path.read_text())
    for name in manifest["files"]:
        part = run / "collect" / manifest["parts"] / name
        save_file({key: tensors[key].contiguous() for key in load_file(part)}, str(part))
        manifest["files"][name] = part.stat().st_size
    path.write_text(json.dumps({**manifest, "progress": progress}))


@pytest.fixture(scope="module")
def partial_run(tiny_checkpoints, corpus, tmp_path_factory):
    """A collection interrupted after 3 batches (its config and run directory), to edit copies of."""
    config = _config(tiny_checkpoints["llama"], corpus)
    run = tmp_path_factory.mktemp("partial") / "run"
    collect(config, run, max_batches=3, progress=False)
    return config, run


def _recompute_keys(tensors):
    tensors["reservoir.keys"] = torch.from_numpy(
        token_keys(tensors["reservoir.positions"].numpy(), 0).view(np.int64).copy()
    )


def _duplicate_token(tensors, progress):
    for name in ("reservoir.keys", "reservoir.positions", "reservoir.token_ids"):
        tensors[name][1] = tensors[name][0]


def _negative_position(tensors, progress):
    tensors["reservoir.positions"][0] = -5
    _recompute_keys(tensors)


def _non_psd_comoment(tensors, progress):
    c = tensors["cov.1.comoment"]
    c[0, 1] = c[1, 0] = 2 * torch.sqrt(c[0, 0] * c[1, 1])


@pytest.mark.parametrize(
    "tamper, field",
    [
        (_duplicate_token, "reservoir.positions"),
        (lambda t, p: p.update(blocks_done=0, batches_done=0), "cov.*.count"),
        (lambda t, p: p.update(blocks_done=10**9), "progress.blocks_done"),
        (lambda t, p: p.update(blocks_done=1.5), "progress.blocks_done"),
        (lambda t, p: p.update(exhausted="no"), "progress.exhausted"),
        (_non_psd_comoment, "comoment"),
        (lambda t, p: t["reservoir.vectors.2"].__setitem__((3, 0), float("nan")), "reservoir.vectors.2"),
        (lambda t, p: t["reservoir.token_ids"].__setitem__(0, 10**9), "reservoir.token_ids"),
        (_negative_position, "reservoir.positions"),
        (lambda t, p: t["reservoir.keys"].__setitem__(0, t["reservoir.keys"][0] + 1), "reservoir.keys"),
        (lambda t, p: t.update({k: v[:-1] for k, v in t.items() if k.startswith("reservoir.")}), "reservoir.keys"),
    ],
)
def test_an_edited_collection_checkpoint_is_refused_naming_the_file_and_field(partial_run, tmp_path, tamper, field):
    """Issue 21: an edited locate checkpoint was resumed into a different l* score with exit 0."""
    import shutil

    config, pristine = partial_run
    shutil.copytree(pristine, tmp_path / "run")
    tensors, progress = _read_checkpoint(tmp_path / "run")
    assert tensors["reservoir.keys"].numel() == 150  # a full reservoir: every field is exercised
    tamper(tensors, progress)
    _rewrite_checkpoint(tmp_path / "run", tensors, progress)
    with pytest.raises(ValueError, match=f"{MANIFEST}.*'{re.escape(field)}") as info:
        collect(config, tmp_path / "run", resume=True, progress=False)
    assert "\n" not in str(info.value)


def test_corpus_too_small_or_empty(tiny_checkpoints, corpus, tmp_path):
    with pytest.raises(ValueError, match="yields only .* tokens .* max_tokens = 240000"):
        collect(_config(tiny_checkpoints["gpt2"], corpus, max_tokens=240000), tmp_path / "a", progress=False)
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("two words\n")
    with pytest.raises(ValueError, match="no full block"):
        collect(_config(tiny_checkpoints["gpt2"], tiny, max_tokens=None), tmp_path / "b", progress=False)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="contains no text"):
        collect(_config(tiny_checkpoints["gpt2"], empty), tmp_path / "c", progress=False)


def test_seq_len_beyond_the_model_is_a_clear_error(tiny_checkpoints, corpus, tmp_path):
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        collect(_config(tiny_checkpoints["gpt2"], corpus, seq_len=200, max_tokens=400), tmp_path / "r", progress=False)


def test_keep_first_keeps_every_position(tiny_checkpoints, corpus, tmp_path):
    result = collect(
        _config(tiny_checkpoints["llama"], corpus, keep_first=True, max_tokens=SEQ_LEN * 6),
        tmp_path / "r",
        progress=False,
    )
    assert result.n_tokens == 6 * SEQ_LEN
    assert np.any(result.statistics.reservoir.positions[: result.statistics.reservoir.size] % SEQ_LEN == 0)


def test_bfloat16_collection_keeps_the_dtype_in_the_reservoir(tiny_checkpoints, corpus, tmp_path):
    result = collect(
        _config(tiny_checkpoints["llama"], corpus, dtype="bfloat16", max_tokens=SEQ_LEN * 6),
        tmp_path / "r",
        progress=False,
    )
    reservoir = result.statistics.reservoir
    assert reservoir.layer_vectors(2).dtype == torch.bfloat16
    assert np.isfinite(result.statistics.covariances[2].covariance).all()
