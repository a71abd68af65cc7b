"""How the bridge's targets are scaled (``--target-scaling``): one scalar std or a std per dimension clipped below at
the median dimension's, against a float64 reference; the per-dimension scaling round-trips, saves with the hybrid,
leaves the reported bridge loss (the fraction of variance unexplained) unchanged, and a run trained with it records
what its statistics gave; older configs load as scalar; bad values are refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dihal_fast.bridge import Bridge, BridgeConfig
from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.errors import DihalValueError
from dihal_fast.hybrid import HybridLM, hidden_state
from dihal_fast.replace import BridgeTrainConfig, train_bridge
from dihal_fast.replace.statistics import target_scales
from dihal_fast.replace.validation import validation_bridge_loss

TEXT = "\n\n".join(f"The fox {i} and the dog read {i % 7} books by the river {i % 3}." for i in range(300))
SMALL = {"width": 32, "heads": 2, "time_dim": 16}


def _reference(variance: np.ndarray, scaling: str) -> tuple[float, np.ndarray | None]:
    std = float(np.sqrt(variance.mean()))
    if scaling == "scalar":
        return std, None
    dim_std = np.sqrt(variance)
    median = np.sort(dim_std)[(len(dim_std) - 1) // 2]  # the median dimension's (the lower one of an even count)
    return std, np.maximum(dim_std, median)


@given(
    size=st.integers(1, 97),
    massive=st.integers(0, 5),
    scale=st.sampled_from([1e-6, 1.0, 1e4]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=60, deadline=None)
def test_target_scales_match_a_float64_reference(size, massive, scale, seed):
    rng = np.random.default_rng(seed)
    variance = scale * rng.exponential(1.0, size)
    variance[: min(massive, size)] *= 1e5  # massive-activation dimensions
    for scaling in ("scalar", "clipped"):
        std, dim_std = target_scales(torch.from_numpy(variance), scaling)
        expected_std, expected_dim = _reference(variance, scaling)
        assert std == pytest.approx(expected_std, rel=1e-12)
        if expected_dim is None:
            assert dim_std is None
        else:
            assert dim_std is not None
            np.testing.assert_allclose(dim_std.numpy(), expected_dim, rtol=1e-12)


def test_clipped_scaling_gives_every_dimension_above_the_median_unit_variance():
    variance = torch.tensor([4.0, 1.0, 9.0, 1e6, 0.25], dtype=torch.float64)
    _, dim_std = target_scales(variance, "clipped")
    assert dim_std is not None
    z_variance = variance / dim_std.pow(2)
    torch.testing.assert_close(z_variance, torch.tensor([1.0, 0.25, 1.0, 1.0, 0.0625], dtype=torch.float64))
    with pytest.raises(DihalValueError, match="unknown target scaling 'whiten'"):
        target_scales(variance, "whiten")
    mostly_constant = torch.tensor([0.0, 0.0, 0.0, 4.0, 9.0], dtype=torch.float64)
    assert target_scales(mostly_constant, "scalar") == (pytest.approx(13.0**0.5 / 5**0.5), None)
    with pytest.raises(DihalValueError, match="median dimension of the hidden state is constant"):
        target_scales(mostly_constant, "clipped")


def _bridge(dim_std: torch.Tensor | None) -> Bridge:
    bridge = Bridge(BridgeConfig(hidden_size=6, condition_size=6, layer=2, width=8, heads=2))
    bridge.set_target_statistics(torch.arange(6, dtype=torch.float64), 2.5, dim_std)
    return bridge


def test_per_dimension_scaling_round_trips_and_saves_with_the_config():
    dim_std = torch.tensor([2.5, 2.5, 40.0, 2.5, 7.0, 1e4], dtype=torch.float64)
    bridge = _bridge(dim_std)
    hidden = torch.randn(2, 3, 6, dtype=torch.float64) * dim_std
    z = bridge.normalize(hidden)
    expected = (hidden - torch.arange(6, dtype=torch.float64)) / dim_std
    torch.testing.assert_close(z.double(), expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(bridge.denormalize(z).double(), hidden, rtol=1e-5, atol=1e-3)
    loaded = Bridge(BridgeConfig.from_dict(json.loads(json.dumps(bridge.config.to_dict()))))
    assert torch.equal(loaded.normalize(hidden), z)
    scalar = _bridge(None)
    assert scalar.config.target_dim_std == []
    torch.testing.assert_close(scalar.normalize(hidden).double(), (hidden - torch.arange(6.0).double()) / 2.5)


def test_a_config_saved_without_per_dimension_std_loads_as_scalar():
    saved = BridgeConfig(hidden_size=4, condition_size=4, layer=1, width=4, heads=1).to_dict()
    del saved["target_dim_std"]
    assert BridgeConfig.from_dict(saved).target_dim_std == []
    train = BridgeTrainConfig().to_dict()
    del train["target_scaling"]
    assert BridgeTrainConfig.from_dict(train).target_scaling == "scalar"


@pytest.mark.parametrize("bad", [[1.0] * 3, [1.0, 1.0, 0.0, 1.0], [1.0, -2.0, 1.0, 1.0]])
def test_bad_per_dimension_std_is_refused(bad):
    with pytest.raises(DihalValueError, match="target_dim_std"):
        BridgeConfig(hidden_size=4, condition_size=4, layer=1, width=4, heads=1, target_dim_std=bad)
    with pytest.raises(DihalValueError, match="per-dimension std"):
        _bridge(torch.ones(5))


def test_auto_scaling_clips_exactly_when_layers_are_copied():
    auto = BridgeTrainConfig(target_scaling="auto")
    assert [auto.scaling_for(k) for k in (0, 1, 2)] == ["scalar", "clipped", "clipped"]
    assert BridgeTrainConfig(target_scaling="scalar").scaling_for(2) == "scalar"
    assert BridgeTrainConfig(target_scaling="clipped").scaling_for(0) == "clipped"


def test_bad_target_scaling_is_refused_in_one_line():
    with pytest.raises(DihalValueError, match="target_scaling"):
        BridgeTrainConfig(target_scaling="whiten")


def test_a_run_with_clipped_scaling_records_its_statistics_and_reports_the_variance_unexplained(
    tiny_checkpoints, tmp_path
):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    options = dict(seq_len=16, batch_size=2, val_blocks=2, stats_blocks=4, steps=2, log_every=1, warmup_steps=1)
    runs = {}
    for scaling in ("scalar", "clipped"):
        config = BridgeTrainConfig(**options, bridge=SMALL, target_scaling=scaling)
        runs[scaling] = train_bridge(tiny_checkpoints["llama"], 1, corpus, tmp_path / scaling, config)
    scalar = HybridLM.from_pretrained(runs["scalar"]["hybrid_dir"]).bridge.config
    clipped = HybridLM.from_pretrained(runs["clipped"]["hybrid_dir"]).bridge.config
    assert scalar.target_dim_std == [] and clipped.target_std == scalar.target_std
    assert clipped.target_mean == scalar.target_mean
    dim_std = np.array(clipped.target_dim_std)
    assert dim_std.shape == (len(scalar.target_mean),)
    # the clip is the median dimension's std; the scalar std is the root mean of the squared stds
    floor = np.sort(dim_std)[(len(dim_std) - 1) // 2]
    assert dim_std.min() == pytest.approx(floor) and (dim_std <= floor * (1 + 1e-12)).sum() >= len(dim_std) // 2
    # the reported bridge loss is over the scalar std under either scaling
    backbone, _ = load_causal_lm(tiny_checkpoints["llama"])
    hybrid = HybridLM.from_pretrained(runs["clipped"]["hybrid_dir"]).eval()
    blocks = torch.randint(3, backbone.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    report = validation_bridge_loss(hybrid, backbone, blocks, batch_size=2)
    with torch.no_grad():
        target = hidden_state(backbone, blocks, 1).double()
        rebuilt = hybrid(blocks, seed=0).bridge_hidden_state.double()
    expected = float(((rebuilt - target) / clipped.target_std).pow(2).mean())
    assert report["bridge_loss"] == pytest.approx(expected, rel=1e-4)


def test_auto_scaling_of_a_run_follows_its_copied_layers(tiny_checkpoints, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    options = dict(seq_len=16, batch_size=2, val_blocks=2, stats_blocks=4, steps=1, log_every=1, warmup_steps=1)
    bridges = {}
    for copied in (0, -1):
        config = BridgeTrainConfig(**options, bridge=SMALL, target_scaling="auto", copied_layers=copied)
        result = train_bridge(tiny_checkpoints["llama"], 2, corpus, tmp_path / f"copied{copied}", config)
        bridges[copied] = HybridLM.from_pretrained(result["hybrid_dir"]).bridge.config
    assert bridges[0].target_dim_std == [] and bridges[-1].copied_layers == 1
    assert len(bridges[-1].target_dim_std) == bridges[-1].hidden_size
