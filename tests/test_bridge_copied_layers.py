"""A bridge whose context encoder keeps the backbone's layers ``1..k`` (``copied_layers``): the copies compute the
backbone's ``h_k`` in every tested family, ``k = l`` starts as the backbone itself (logits, greedy and beam
decoding), the cache equals a full recompute, the hybrid saves and loads, training touches only what it should,
and bad values are refused in one line."""

from __future__ import annotations

import pytest
import torch

from dihal_fast.bridge import BridgeConfig
from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.errors import DihalValueError
from dihal_fast.hybrid import HybridLM, backbone_targets
from dihal_fast.replace import BridgeTrainConfig
from dihal_fast.testing import make_tiny_checkpoint
from dihal_fast.testing.tiny import FAMILIES, MORE_FAMILIES

SMALL = {"width": 32, "heads": 2, "time_dim": 16}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("copied")
    return {family: make_tiny_checkpoint(root / family, family) for family in FAMILIES + MORE_FAMILIES}


def _ids(model, batch: int = 2, length: int = 11, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (batch, length), generator=generator)


@pytest.mark.parametrize("family", FAMILIES + MORE_FAMILIES)
def test_copied_layers_compute_the_backbones_hidden_state(checkpoints, family):
    model, tokenizer = load_causal_lm(checkpoints[family])
    hybrid = HybridLM.from_backbone(model, 2, {**SMALL, "copied_layers": 1}, tokenizer).eval()
    ids = _ids(model)
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    expected, _ = backbone_targets(model, ids, 1)
    with torch.no_grad():
        copied = hybrid.bridge.copied_hidden_state(hybrid.condition(ids, positions), positions, None, None)
    torch.testing.assert_close(copied, expected, atol=1e-5, rtol=1e-5)
    assert hybrid.bridge.config.context_layers == 1  # one learned block for the one replaced layer not copied


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2"])
def test_all_replaced_layers_copied_start_as_the_backbone(checkpoints, family):
    model, tokenizer = load_causal_lm(checkpoints[family])
    hybrid = HybridLM.from_backbone(model, 2, {**SMALL, "copied_layers": 2}, tokenizer).eval()
    ids = _ids(model)
    with torch.no_grad():
        torch.testing.assert_close(hybrid(ids).logits, model(ids).logits, atol=1e-4, rtol=1e-4)
        prompt = ids[:1, :4]
        settings = {"max_new_tokens": 6, "do_sample": False, "eos_token_id": None, "pad_token_id": 0}
        assert torch.equal(hybrid.generate(prompt, **settings), model.generate(prompt, **settings))
        beams = {**settings, "num_beams": 3}
        assert torch.equal(hybrid.generate(prompt, **beams), model.generate(prompt, **beams))


def test_cached_decoding_equals_a_full_recompute(checkpoints):
    model, tokenizer = load_causal_lm(checkpoints["llama"])
    torch.manual_seed(0)
    hybrid = HybridLM.from_backbone(model, 3, {**SMALL, "copied_layers": 2}, tokenizer).eval()
    torch.nn.init.normal_(hybrid.bridge.out.weight, std=0.1)  # a correction that is not zero
    ids = _ids(model, batch=2, length=10, seed=1)
    with torch.no_grad():
        full = hybrid(ids).logits
        cache = hybrid.new_cache()
        pieces = [hybrid(ids[:, a:b], cache=cache, use_cache=True).logits for a, b in ((0, 4), (4, 5), (5, 10))]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 10


def test_saved_hybrid_with_copied_layers_loads_whole(checkpoints, tmp_path):
    model, tokenizer = load_causal_lm(checkpoints["qwen3"])
    hybrid = HybridLM.from_backbone(model, 2, {**SMALL, "copied_layers": 2}, tokenizer).eval()
    hybrid.save_pretrained(tmp_path / "hybrid")
    loaded = HybridLM.from_pretrained(tmp_path / "hybrid")
    ids = _ids(model)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, hybrid(ids).logits, atol=0, rtol=0)
    assert loaded.bridge.config.copied_layers == 2
    assert not any(p.requires_grad for p in loaded.bridge.copied.parameters())


def test_copied_layers_are_frozen_unless_asked(checkpoints):
    model, tokenizer = load_causal_lm(checkpoints["llama"])
    frozen = HybridLM.from_backbone(model, 2, {**SMALL, "copied_layers": 1}, tokenizer)
    trained = HybridLM.from_backbone(model, 2, {**SMALL, "copied_layers": 1, "train_copied_layers": True}, tokenizer)
    assert not any(p.requires_grad for p in frozen.bridge.copied.parameters())
    assert all(p.requires_grad for p in trained.bridge.copied.layers.parameters())
    assert any(p.requires_grad for n, p in frozen.bridge.named_parameters() if not n.startswith("copied."))


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"copied_layers": 3}, "copied_layers = 3"),
        ({"copied_layers": -1}, "copied_layers = -1"),
        ({"copied_layers": 1, "prediction": "eps"}, "needs prediction 'x0'"),
    ],
)
def test_bad_copied_layers_are_refused(options, match):
    with pytest.raises(DihalValueError, match=match):
        BridgeConfig(hidden_size=8, condition_size=8, layer=2, **options)


def test_bad_copied_layers_of_a_training_run_are_refused():
    with pytest.raises(DihalValueError, match="copied-layers"):
        BridgeTrainConfig(copied_layers=-2)
    with pytest.raises(DihalValueError, match="needs prediction 'x0'"):
        BridgeTrainConfig(copied_layers=1, bridge={"prediction": "eps"})
    assert BridgeTrainConfig(copied_layers=0, bridge={"prediction": "eps"}).bridge_options(8, 2).copied_layers == 0


def test_replace_copies_all_but_the_last_replaced_layer_by_default_and_the_sweep_none():
    from dihal_fast.pipeline.sweep_stage import SweepBudgetConfig

    assert BridgeTrainConfig().bridge_options(8, layer=3).copied_layers == 2
    assert BridgeTrainConfig().bridge_options(8, layer=3).context_layers == 1  # one learned block for layer 3
    assert BridgeTrainConfig().bridge_options(8, layer=1).copied_layers == 0  # l* = 1: the paper's bridge
    assert BridgeTrainConfig(copied_layers=3).bridge_options(8, layer=3).context_layers == 0
    assert SweepBudgetConfig().train_config().bridge_options(8, layer=3).copied_layers == 0
    with pytest.raises(DihalValueError, match="copied_layers = 4"):
        BridgeTrainConfig(copied_layers=4).bridge_options(8, layer=3)


def test_copied_layers_need_the_backbones_config():
    with pytest.raises(DihalValueError, match="needs copied_config"):
        from dihal_fast.bridge import Bridge

        Bridge(BridgeConfig(hidden_size=8, condition_size=8, layer=2, copied_layers=1))


def test_random_copies_are_refused_frozen():
    with pytest.raises(DihalValueError, match="--copied-init random needs --train-copied-layers"):
        BridgeTrainConfig(copied_layers=1, copied_init="random")


def test_the_from_scratch_control_trains_randomly_initialised_copies(checkpoints, tmp_path):
    from dihal_fast.replace import train_bridge

    model, tokenizer = load_causal_lm(checkpoints["llama"])
    ids = _ids(model)
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    expected, _ = backbone_targets(model, ids, 1)
    options = {**SMALL, "copied_layers": 1, "train_copied_layers": True}
    fresh = HybridLM.from_backbone(model, 2, options, tokenizer, copy_weights=False).eval()
    with torch.no_grad():
        random_h1 = fresh.bridge.copied_hidden_state(fresh.condition(ids, positions), positions, None, None)
    assert (random_h1 - expected).norm() > 0.3 * expected.norm()  # not the backbone's layer 1
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 60)
    config = BridgeTrainConfig(
        seq_len=16, batch_size=2, val_blocks=2, stats_blocks=4, steps=3, warmup_steps=1, log_every=1,
        copied_layers=1, train_copied_layers=True, copied_init="random", bridge=SMALL,
    )  # fmt: skip
    result = train_bridge(checkpoints["llama"], 2, corpus, tmp_path / "run", config)
    trained = HybridLM.from_pretrained(result["hybrid_dir"]).eval()
    copied = dict(trained.bridge.copied.layers.named_parameters())
    started = dict(fresh.bridge.copied.layers.named_parameters())
    backbone_layer = dict(model.model.layers[0].named_parameters())
    assert all(p.requires_grad for p in copied.values())
    for name, value in copied.items():  # started from the seed's random init, moved by training; never the backbone's
        assert not torch.equal(value, backbone_layer[name.removeprefix("0.")])
    assert any(not torch.equal(copied[n], started[n]) for n in copied)
