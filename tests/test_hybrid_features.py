"""The transformers features a user reaches for on the hybrid: gradient checkpointing over the bridge and the
retained layers (same gradients, and the layers really recomputed), hidden states and attentions of the
retained layers (equal to the backbone's own when fed the true ``h_l``), ``attn_implementation`` reaching the
retained layers, output embeddings and resizing, the usual config attributes, and ``dihal locate`` on a hybrid."""

from __future__ import annotations

import pytest
import torch

from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.errors import DihalValueError
from dihal_fast.hybrid import HybridLM, backbone_targets

LAYER = 2


@pytest.fixture(scope="module")
def backbone(tiny_checkpoints):
    return load_causal_lm(tiny_checkpoints["llama"])


@pytest.fixture(scope="module")
def saved(backbone, tiny_checkpoints, tmp_path_factory):
    model, tokenizer = backbone
    torch.manual_seed(0)
    hybrid = HybridLM.from_backbone(model, LAYER, {"width": 32, "heads": 2}, tokenizer, tiny_checkpoints["llama"])
    torch.nn.init.normal_(hybrid.bridge.out.weight, std=0.3)
    return hybrid.save_pretrained(tmp_path_factory.mktemp("hybrid") / "h")


def _ids(length: int = 10) -> torch.Tensor:
    return torch.randint(3, 384, (2, length), generator=torch.Generator().manual_seed(0))


def _gradients(model: HybridLM, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(ids, labels=ids, seed=5).loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_gradient_checkpointing_gives_the_same_gradients_and_recomputes(saved):
    model = HybridLM.from_pretrained(saved)
    model.set_upper_trainable(True)
    model.train()
    ids = _ids()
    plain = _gradients(model, ids)
    calls = {"bridge": 0, "retained": 0}
    # pre-hooks: torch's recompute stops (inside the module) once it has every tensor the backward needs
    model.bridge.context[0].register_forward_pre_hook(lambda *_: calls.__setitem__("bridge", calls["bridge"] + 1))
    model.upper.model.layers[0].mlp.register_forward_pre_hook(
        lambda *_: calls.__setitem__("retained", calls["retained"] + 1)
    )
    model.gradient_checkpointing_enable()
    checkpointed = _gradients(model, ids)
    assert calls == {"bridge": 2, "retained": 2}  # forward + the recompute in backward
    assert plain.keys() == checkpointed.keys() and any(name.startswith("upper.") for name in plain)
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    model.eval()
    with torch.no_grad():
        assert model(ids).logits.shape == (2, 10, 384)
    assert not model.upper.training and not model.upper.model.layers[0].mlp.training


def test_hidden_states_are_the_bridge_output_then_the_backbones_own(backbone, saved):
    model = HybridLM.from_pretrained(saved)
    ids = _ids()
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        assert len(out.hidden_states) == model.config.num_hidden_layers + 1
        assert torch.equal(out.hidden_states[0], out.bridge_hidden_state)
        hidden, _ = backbone_targets(backbone[0], ids, LAYER)
        oracle = model(ids, hidden_state_oracle=hidden, output_hidden_states=True).hidden_states
        reference = backbone[0](ids, output_hidden_states=True).hidden_states[LAYER:]
    assert len(oracle) == len(reference)
    for mine, theirs in zip(oracle, reference):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_attentions_of_the_retained_layers_need_eager_and_match_the_backbone(tiny_checkpoints, saved):
    with pytest.raises(DihalValueError, match="output_attentions needs the retained layers on eager attention"):
        HybridLM.from_pretrained(saved)(_ids(), output_attentions=True)
    model = HybridLM.from_pretrained(saved, attn_implementation="eager")
    assert model.upper.config._attn_implementation == "eager"
    backbone, _ = load_causal_lm(tiny_checkpoints["llama"])
    backbone.set_attn_implementation("eager")
    ids = _ids()
    with torch.no_grad():
        hidden, _ = backbone_targets(backbone, ids, LAYER)
        mine = model(ids, hidden_state_oracle=hidden, output_attentions=True).attentions
        theirs = backbone(ids, output_attentions=True).attentions[LAYER:]
    assert len(mine) == model.config.num_hidden_layers == len(theirs)
    for a, b in zip(mine, theirs):
        assert a.shape == (2, 4, 10, 10)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_output_embeddings_and_resizing(saved, tmp_path):
    model = HybridLM.from_pretrained(saved)
    assert model.get_output_embeddings() is model.upper.lm_head
    model.resize_token_embeddings(400)
    assert model.config.vocab_size == 400 and model.config.upper["vocab_size"] == 400
    assert not model.get_input_embeddings().weight.requires_grad  # frozen as before
    with torch.no_grad():
        assert model(torch.tensor([[1, 399]])).logits.shape == (1, 2, 400)
    reloaded = HybridLM.from_pretrained(model.save_pretrained(tmp_path / "resized"))
    assert reloaded.get_input_embeddings().weight.shape == (400, 32)


def test_the_usual_config_attributes(saved):
    config = HybridLM.from_pretrained(saved).config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (2, 4, 4)
    assert (config.hidden_size, config.vocab_size) == (32, 384)


def test_locate_on_a_hybrid_is_refused_in_one_line(saved, tmp_path, capsys):
    from dihal_fast.cli import main

    assert main(["locate", "--model", str(saved), "--out", str(tmp_path / "loc")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1, errors
