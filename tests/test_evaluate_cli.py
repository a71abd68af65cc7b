"""The evaluation harness and ``dihal evaluate`` on tiny checkpoints (a few steps, small budgets)."""
from __future__ import annotations

import math

import pytest
import torch

from dihal_fast.evaluate.harness import EvalSettings, evaluate_lm, heldout_blocks
from dihal_fast.evaluate.models import load_lm
from dihal_fast.evaluate.run import check_compatible

TEXT = "\n\n".join(
    f"Story {i}: once upon a time a fox and a dog went to the river number {i % 7} and read books together."
    for i in range(60)
)
SETTINGS = EvalSettings(seq_len=24, eval_blocks=4, batch_size=2, n_samples=4, max_new_tokens=12)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text(TEXT)
    return path


@pytest.fixture(scope="module")
def models(tiny_checkpoints):
    torch.set_num_threads(1)
    return {name: load_lm(tiny_checkpoints[name]) for name in ("llama", "gpt2")}


def test_heldout_blocks_are_the_corpus_tail(models, corpus):
    lm = models["llama"]
    blocks = heldout_blocks(lm.tokenizer, corpus, SETTINGS)
    ids = []
    for paragraph in TEXT.split("\n\n"):
        ids += lm.tokenizer(paragraph, add_special_tokens=False)["input_ids"] + [lm.tokenizer.eos_token_id]
    n = len(ids) // 24
    assert blocks.shape == (4, 24)
    assert blocks.flatten().tolist() == ids[(n - 4) * 24 : n * 24]


def test_section_holds_every_metric(models, corpus):
    backbone, other = models["llama"], models["gpt2"]
    blocks = heldout_blocks(backbone.tokenizer, corpus, SETTINGS)
    section, texts = evaluate_lm(other, blocks, SETTINGS, evaluator=backbone, reference=backbone)
    for key in ("nll", "ppl", "kl", "gen_ppl", "entropy", "diversity_dihal", "diversity_ld4lg", "tokens_per_s"):
        assert isinstance(section[key], float) and math.isfinite(section[key]), key
    assert section["ppl"] == pytest.approx(math.exp(section["nll"]))
    assert section["kl"] > 0.01  # two different random models (same tokenizer)
    assert len(texts) == 4 and section["gen_ppl_details"]["evaluator_dtype"] == "float32"
    same, _ = evaluate_lm(backbone, blocks, SETTINGS, evaluator=backbone, reference=backbone)
    assert abs(same["kl"]) < 1e-6


def test_evaluator_with_another_tokenizer_is_a_clear_error(models):
    with pytest.raises(ValueError, match="tokenizer differs"):
        check_compatible(models["llama"], _with_other_tokenizer(models["gpt2"]), retokenise=False)
    check_compatible(models["llama"], _with_other_tokenizer(models["gpt2"]), retokenise=True)


def _with_other_tokenizer(lm):
    from dihal_fast.testing import make_tiny_tokenizer

    lm = type(lm)(**{**lm.__dict__})
    lm.tokenizer = make_tiny_tokenizer(vocab_size=300)
    return lm


def test_diffusion_lm_control_trains_samples_and_resumes(models, corpus, tmp_path):
    from dihal_fast.evaluate.run import _diffusion_lm_section

    backbone = models["llama"]
    section, texts = _diffusion_lm_section(backbone, corpus, tmp_path, SETTINGS, backbone, steps=30)
    assert section["nll"] is None and "likelihood" in section["likelihood_note"]
    assert len(texts) == 4 and section["gen_ppl"] > 1 and section["entropy"] > 0
    again, texts_again = _diffusion_lm_section(backbone, corpus, tmp_path, SETTINGS, backbone, steps=30)
    assert texts_again == texts  # reloaded from the finished checkpoint, same seed
