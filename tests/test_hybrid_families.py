"""Families by capability: ``replace`` (a few steps) + ``generate`` on tiny Qwen2, Gemma, Gemma2, Phi3 and
GPT-NeoX checkpoints, the oracle path on each, and the refusal (with the reason) of models that cannot be cut."""

from __future__ import annotations

import pytest
import torch

from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.hybrid import HybridLM, backbone_targets
from dihal_fast.testing import make_tiny_checkpoint
from dihal_fast.testing.tiny import MORE_FAMILIES

TEXT = "\n\n".join(f"The fox {i} and the dog read {i % 5} books by the river." for i in range(120))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("families")
    return {family: make_tiny_checkpoint(root / family, family) for family in MORE_FAMILIES}


@pytest.mark.parametrize("family", MORE_FAMILIES)
def test_oracle_hidden_state_reproduces_the_backbone(checkpoints, family):
    model, tokenizer = load_causal_lm(checkpoints[family])
    hybrid = HybridLM.from_backbone(model, 2, {"width": 32, "heads": 2}, tokenizer).eval()
    ids = torch.randint(3, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    hidden, logits = backbone_targets(model, ids, 2)
    with torch.no_grad():
        torch.testing.assert_close(hybrid(ids, hidden_state_oracle=hidden).logits, logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", MORE_FAMILIES)
def test_replace_then_generate(checkpoints, family, tmp_path):
    from dihal_fast.replace import BridgeTrainConfig, train_bridge

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    config = BridgeTrainConfig(
        seq_len=16,
        batch_size=2,
        val_blocks=2,
        stats_blocks=4,
        steps=2,
        checkpoint_every=2,
        log_every=1,
        warmup_steps=1,
        bridge={"width": 32, "heads": 2, "time_dim": 16},
    )
    result = train_bridge(checkpoints[family], 1, corpus, tmp_path / "run", config)
    hybrid = HybridLM.from_pretrained(result["hybrid_dir"])
    assert hybrid.config.family == family and result["bridge_loss"] > 0
    prompt = hybrid.tokenizer("The fox", return_tensors="pt")
    out = hybrid.generate(**prompt, max_new_tokens=5, do_sample=True, eos_token_id=None)
    assert out.shape == (1, prompt["input_ids"].shape[1] + 5)


def test_models_that_cannot_be_cut_are_refused_with_the_reason(tmp_path):
    from transformers import AutoModelForCausalLM, BloomConfig, OPTConfig

    bloom = AutoModelForCausalLM.from_config(BloomConfig(vocab_size=64, hidden_size=32, n_layer=3, n_head=4))
    with pytest.raises(ValueError, match="'bloom' cannot be cut.*first decoder block does not see the input embedding"):
        HybridLM.from_backbone(bloom.eval(), 1)
    opt = AutoModelForCausalLM.from_config(
        OPTConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=3,
            ffn_dim=64,
            num_attention_heads=4,
            word_embed_proj_dim=32,
        )
    )
    with pytest.raises(ValueError, match="'opt' cannot be cut.*no ModuleList of 3 decoder blocks named layers or h"):
        HybridLM.from_backbone(opt.eval(), 1)
