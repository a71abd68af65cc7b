"""A new user's pass with transformers' Trainer on a tiny hybrid (CPU, a few steps): gradient checkpointing on,
checkpoints every step, then ``save_model`` into the same output folder, which keeps the checkpoints and
holds a hybrid that loads with its tokenizer and gives the trained model's logits."""

from __future__ import annotations

import pytest
import torch

from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.hybrid import HybridLM

pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")


def test_trainer_with_gradient_checkpointing_then_save_model(tiny_checkpoints, tmp_path):
    from transformers import AutoTokenizer, Trainer, TrainingArguments

    backbone, tokenizer = load_causal_lm(tiny_checkpoints["llama"])
    torch.manual_seed(0)
    hybrid = HybridLM.from_backbone(backbone, 2, {"width": 32, "heads": 2}, tokenizer, tiny_checkpoints["llama"])
    before = hybrid.bridge.out.weight.detach().clone()
    ids = torch.randint(3, 384, (8, 12), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]
    out = tmp_path / "trainer"
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        save_strategy="steps",
        save_steps=1,
        gradient_checkpointing=True,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=hybrid, args=args, train_dataset=data, processing_class=tokenizer)
    result = trainer.train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    assert hybrid.gradient_checkpointing and not torch.equal(hybrid.bridge.out.weight, before)
    checkpoints = sorted(path.name for path in out.glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-1", "checkpoint-2"]
    hybrid.tokenizer = None  # as a user's model would be: the Trainer saves the tokenizer itself
    trainer.save_model(str(out))
    assert sorted(path.name for path in out.glob("checkpoint-*")) == checkpoints
    assert (out / "checkpoint-1" / "config.json").is_file()
    loaded = HybridLM.from_pretrained(out)
    assert loaded.tokenizer is not None and AutoTokenizer.from_pretrained(out)("text").input_ids
    hybrid.eval()
    with torch.no_grad():
        assert torch.equal(loaded(ids[:2]).logits, hybrid(ids[:2]).logits)
