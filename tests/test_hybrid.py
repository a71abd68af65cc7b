"""HybridLM on tiny Llama / Qwen3 / GPT-2 / Mistral checkpoints: the oracle path reproduces the backbone,
causality, incremental generation (transformers' generate) against full recompute, the noise definition
(deterministic by default, stochastic on request), labels -> loss, EOS, save/load, bad input."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.hybrid import HybridLM, backbone_targets
from dihal_fast.hybrid.generation import float64_sampling, nucleus_mask
from dihal_fast.hybrid.slicing import check_family, check_layer

FAMILIES = ("llama", "qwen3", "gpt2", "mistral")


@pytest.fixture(scope="module")
def backbones(tiny_checkpoints):
    return {family: (*load_causal_lm(tiny_checkpoints[family]), tiny_checkpoints[family]) for family in FAMILIES}


def _hybrid(backbones, family: str, layer: int = 2, **bridge) -> HybridLM:
    model, tokenizer, path = backbones[family]
    torch.manual_seed(0)
    hybrid = HybridLM.from_backbone(model, layer, {"width": 32, "heads": 2, **bridge}, tokenizer, path).eval()
    torch.nn.init.normal_(hybrid.bridge.out.weight, std=0.3)  # a fresh bridge outputs the mean: make it depend on x
    return hybrid


def _ids(model, batch: int = 2, length: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, model.config.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layer", [1, 3])
def test_oracle_hidden_state_reproduces_backbone_logits_exactly(backbones, family, layer):
    model = backbones[family][0]
    hybrid = _hybrid(backbones, family, layer)
    ids = _ids(model)
    hidden, logits = backbone_targets(model, ids, layer)
    with torch.no_grad():
        out = hybrid(ids, hidden_state_oracle=hidden)
        hidden_states = model(ids, output_hidden_states=True).hidden_states
    assert torch.equal(out.logits, logits)
    assert torch.equal(hidden, hidden_states[layer])
    assert torch.equal(hybrid.condition(ids, torch.arange(12).expand(2, 12)), hidden_states[0])


@pytest.mark.parametrize("family", FAMILIES)
def test_changing_token_j_never_changes_logits_before_j(backbones, family):
    model = backbones[family][0]
    hybrid = _hybrid(backbones, family)
    ids = _ids(model, length=10)
    with torch.no_grad():
        reference = hybrid(ids, seed=3).logits
        for j in (0, 4, 9):
            changed = ids.clone()
            changed[:, j] = (changed[:, j] + 7) % model.config.vocab_size
            logits = hybrid(changed, seed=3).logits
            assert torch.equal(logits[:, :j], reference[:, :j])
            assert not torch.allclose(logits[:, j], reference[:, j])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("sampler,nfe", [("ddpm", 3), ("heun", 3)])
def test_incremental_generation_equals_full_recompute(backbones, family, sampler, nfe):
    model = backbones[family][0]
    hybrid = _hybrid(backbones, family)
    prompt = _ids(model, length=5)
    kwargs = {"max_new_tokens": 7, "seed": 11, "nfe": nfe, "sampler": sampler, "eos_token_id": None, "do_sample": True}
    torch.manual_seed(0)
    generated = hybrid.generate(prompt, output_logits=True, return_dict_in_generate=True, **kwargs)
    sequences = generated.sequences
    assert sequences.shape == (2, 12) and torch.equal(sequences[:, :5], prompt)
    with torch.no_grad():
        full = hybrid(sequences[:, :-1], seed=11, nfe=nfe, sampler=sampler).logits[:, 4:]
    torch.testing.assert_close(torch.stack(generated.logits, dim=1), full, atol=2e-5, rtol=1e-5)
    torch.manual_seed(0)
    assert torch.equal(hybrid.generate(prompt, **kwargs), sequences)


def test_left_padding_and_batching_match_the_unpadded_row(backbones):
    model = backbones["llama"][0]
    hybrid = _hybrid(backbones, "llama", sampler="ddpm", nfe=2)
    ids = _ids(model, batch=1, length=6)
    other = _ids(model, batch=1, length=9, seed=1)
    padded = torch.cat([torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1), other])
    mask = torch.ones_like(padded)
    mask[0, :3] = 0
    with torch.no_grad():
        alone = hybrid(ids).logits
        in_batch = hybrid(padded, attention_mask=mask).logits[:1, 3:]
        seeded = hybrid(ids, seed=5).logits
        seeded_padded = hybrid(padded[:1], attention_mask=mask[:1], seed=5).logits[:, 3:]
    torch.testing.assert_close(in_batch, alone, atol=2e-5, rtol=1e-5)  # default noise: the same for every row
    torch.testing.assert_close(seeded_padded, seeded, atol=2e-5, rtol=1e-5)
    greedy = hybrid.generate(padded, attention_mask=mask, max_new_tokens=3, do_sample=False, eos_token_id=None)
    alone_greedy = hybrid.generate(ids, max_new_tokens=3, do_sample=False, eos_token_id=None)
    assert torch.equal(greedy[:1, 9:], alone_greedy[:, 6:])


def test_scoring_is_deterministic_by_default_and_stochastic_on_request(backbones):
    model = backbones["qwen3"][0]
    hybrid = _hybrid(backbones, "qwen3", sampler="ddpm", nfe=3)
    ids = _ids(model)
    with torch.no_grad():
        first = hybrid(ids, labels=ids)
        torch.manual_seed(123)
        second = hybrid(ids, labels=ids)
        assert torch.equal(first.logits, second.logits) and first.loss.item() == second.loss.item()
        hybrid.config.stochastic_noise = True
        torch.manual_seed(1)
        a = hybrid(ids).logits
        torch.manual_seed(1)
        b = hybrid(ids).logits
        torch.manual_seed(2)
        c = hybrid(ids).logits
        hybrid.config.stochastic_noise = False
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, first.logits)


def test_labels_give_the_shifted_cross_entropy(backbones):
    model = backbones["gpt2"][0]
    hybrid = _hybrid(backbones, "gpt2")
    ids = _ids(model, length=8)
    labels = ids.clone()
    labels[0, :3] = -100
    with torch.no_grad():
        out = hybrid(ids, labels=labels)
        as_tuple = hybrid(ids, labels=labels, return_dict=False)
    logits = out.logits[:, :-1].reshape(-1, out.logits.shape[-1]).float()
    expected = torch.nn.functional.cross_entropy(logits, labels[:, 1:].reshape(-1), ignore_index=-100)
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], out.loss)


def test_greedy_generation_is_repeatable_and_stops_at_eos(backbones):
    model = backbones["mistral"][0]
    hybrid = _hybrid(backbones, "mistral")
    prompt = _ids(model, batch=1, length=4)
    free = hybrid.generate(prompt, max_new_tokens=8, do_sample=False, eos_token_id=None)
    assert free.shape == (1, 12)
    assert torch.equal(free, hybrid.generate(prompt, max_new_tokens=8, do_sample=False, eos_token_id=None))
    eos = int(free[0, 6])  # the third generated token becomes EOS: generation ends at its first occurrence
    first = int((free[0, 4:] == eos).nonzero()[0])
    stopped = hybrid.generate(prompt, max_new_tokens=8, do_sample=False, eos_token_id=eos)
    assert first <= 2 and torch.equal(stopped, free[:, : 4 + first + 1])
    float64 = hybrid.generate(prompt, max_new_tokens=8, eos_token_id=eos, **float64_sampling(temperature=0))
    assert torch.equal(float64, stopped)


@pytest.mark.parametrize("family", FAMILIES)
def test_save_load_round_trip_gives_identical_logits(backbones, family, tmp_path):
    model = backbones[family][0]
    hybrid = _hybrid(backbones, family)
    hybrid.bridge.set_target_statistics(torch.randn(model.config.hidden_size), 1.7)
    hybrid.save_pretrained(tmp_path / "hybrid")
    loaded = HybridLM.from_pretrained(tmp_path / "hybrid")
    ids = _ids(model)
    with torch.no_grad():
        assert torch.equal(loaded(ids, seed=4).logits, hybrid(ids, seed=4).logits)
    assert {**loaded.config.to_dict(), "_name_or_path": ""} == {**hybrid.config.to_dict(), "_name_or_path": ""}
    assert loaded.tokenizer.get_vocab() == backbones[family][1].get_vocab()
    assert loaded.config.backbone_config == json.loads(model.config.to_json_string())
    kwargs = {"max_new_tokens": 4, "do_sample": False, "eos_token_id": None, "seed": 1}
    assert torch.equal(loaded.generate(ids[:, :3], **kwargs), hybrid.generate(ids[:, :3], **kwargs))


def test_check_backbone_catches_a_replaced_checkpoint(backbones, tmp_path):
    from dihal_fast.testing import make_tiny_checkpoint

    hybrid = _hybrid(backbones, "llama")
    hybrid.check_backbone(backbones["llama"][0])
    other = load_causal_lm(make_tiny_checkpoint(tmp_path / "other", "llama", seed=1))[0]
    with pytest.raises(ValueError, match="differs from the one this hybrid was cut from"):
        hybrid.check_backbone(other)
    with pytest.raises(ValueError, match="4-layer qwen3"):
        hybrid.check_backbone(backbones["qwen3"][0])


def test_frozen_by_default_and_optionally_unfrozen(backbones):
    hybrid = _hybrid(backbones, "llama")
    assert all(p.requires_grad for p in hybrid.bridge.parameters())
    assert not any(p.requires_grad for p in hybrid.upper.parameters())
    hybrid.set_upper_trainable(True)
    trainable = {name for name, p in hybrid.upper.named_parameters() if p.requires_grad}
    assert any(".layers." in name for name in trainable) and "model.norm.weight" in trainable
    assert not any("embed" in name or "lm_head" in name for name in trainable)
    hybrid.train()
    assert hybrid.bridge.training and not hybrid.upper.training


def test_bad_inputs_raise_clear_errors(backbones, tmp_path):
    from transformers import BertConfig

    with pytest.raises(ValueError, match="'bert' cannot be cut into a hybrid: it is a bidirectional encoder"):
        check_family(BertConfig())
    with pytest.raises(ValueError, match="'clip' cannot be cut into a hybrid: transformers has no causal-LM class"):
        check_family(__import__("transformers").CLIPConfig())
    with pytest.raises(ValueError, match="'t5' cannot be cut into a hybrid: it is an encoder-decoder model"):
        check_family(__import__("transformers").T5Config())
    config = backbones["llama"][0].config
    for layer in (0, config.num_hidden_layers, -1):
        with pytest.raises(ValueError, match=r"layer must be an integer in 1\.\.3"):
            check_layer(config, layer)
    with pytest.raises(FileNotFoundError):
        HybridLM.from_pretrained(tmp_path / "missing")
    hybrid = _hybrid(backbones, "gpt2")
    hybrid.save_pretrained(tmp_path / "h")
    (tmp_path / "h" / "model.safetensors").write_bytes(b"\x00" * 50)
    with pytest.raises(ValueError, match="corrupt"):
        HybridLM.from_pretrained(tmp_path / "h")
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    (tmp_path / "h" / "config.json").write_text(json.dumps({**config, "format": "other"}))
    with pytest.raises(ValueError, match="not a dihal_fast.hybrid/2 config"):
        HybridLM.from_pretrained(tmp_path / "h")
    ids = _ids(backbones["gpt2"][0], length=4)
    with pytest.raises(ValueError, match="exceeds the context"):
        hybrid.generate(ids, max_new_tokens=1000, do_sample=False)
    with pytest.raises(TypeError, match="HybridCache"):
        hybrid(ids, cache=__import__("transformers").DynamicCache())
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        hybrid(ids, attention_mask=torch.ones(2, 3, dtype=torch.long))


@given(seed=st.integers(0, 10**6), top_p=st.floats(0.05, 0.99), temperature=st.floats(0.3, 2.0))
def test_nucleus_keeps_the_smallest_set_reaching_top_p(seed, top_p, temperature):
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3
    kept = torch.isfinite(nucleus_mask(logits, temperature, top_p))
    probs = torch.softmax(logits / temperature, dim=-1)
    for row in range(3):
        ordered = probs[row].sort(descending=True).values
        needed = int((ordered.cumsum(0) < top_p).sum()) + 1
        assert int(kept[row].sum()) == min(needed, 20)
        if not kept[row].all():
            assert probs[row][kept[row]].min() >= probs[row][~kept[row]].max()
    assert torch.isfinite(nucleus_mask(logits, temperature, 1.0)).all()
    with pytest.raises(ValueError, match="top_p"):
        nucleus_mask(logits, temperature, 0.0)
