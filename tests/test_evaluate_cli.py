"""The evaluation harness and ``dihal evaluate`` on tiny checkpoints (a few steps, small budgets)."""

from __future__ import annotations

import dataclasses
import math
import shutil

import pytest
import torch

from dihal_fast.evaluate.generation import Generation
from dihal_fast.evaluate.harness import TIMING_REPEATS, EvalProtocolConfig, evaluate_lm, heldout_blocks, timed_sample
from dihal_fast.evaluate.loaded_lm import load_lm
from dihal_fast.evaluate.run import check_compatible

TEXT = "\n\n".join(
    f"Story {i}: once upon a time a fox and a dog went to the river number {i % 7} and read books together."
    for i in range(60)
)
SETTINGS = EvalProtocolConfig(seq_len=24, eval_blocks=4, batch_size=2, n_samples=4, max_new_tokens=12)


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
    blocks = heldout_blocks(lm.tokenizer, corpus, SETTINGS).blocks
    ids = []
    for paragraph in TEXT.split("\n\n"):
        ids += lm.tokenizer(paragraph, add_special_tokens=False)["input_ids"] + [lm.tokenizer.eos_token_id]
    n = len(ids) // 24
    assert blocks.shape == (4, 24)
    assert blocks.flatten().tolist() == ids[(n - 4) * 24 : n * 24]


def test_section_holds_every_metric(models, corpus):
    backbone, other = models["llama"], models["gpt2"]
    blocks = heldout_blocks(backbone.tokenizer, corpus, SETTINGS).blocks
    section, texts = evaluate_lm(other, blocks, SETTINGS, evaluator=backbone, reference=backbone)
    for key in ("nll", "ppl", "kl", "gen_ppl", "entropy", "diversity_dihal", "diversity_ld4lg", "tokens_per_s"):
        assert isinstance(section[key], float) and math.isfinite(section[key]), key
    assert section["ppl"] == pytest.approx(math.exp(section["nll"]))
    assert section["kl"] > 0.01  # two different random models (same tokenizer)
    assert len(texts) == 4 and section["gen_ppl_details"]["evaluator_dtype"] == "float32"
    same, _ = evaluate_lm(backbone, blocks, SETTINGS, evaluator=backbone, reference=backbone)
    assert abs(same["kl"]) < 1e-6


def test_tokens_per_second_comes_from_the_fastest_identical_call():
    class Timed:
        calls = []

        def sample(self, prompt, max_new_tokens, temperature, top_k, generator, top_p):
            assert top_p == 0.5
            self.calls.append(int(torch.randint(0, 1000, (1,), generator=generator)))
            return Generation(torch.zeros(2, max_new_tokens, dtype=torch.long), [3.0, 1.0, 2.0][len(self.calls) - 1])

    lm = Timed()
    generation = timed_sample(lm, torch.zeros(2, 1, dtype=torch.long), dataclasses.replace(SETTINGS, top_p=0.5))
    assert generation.seconds == 1.0 and len(set(lm.calls)) == 1 and len(lm.calls) == TIMING_REPEATS == 3


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


@pytest.fixture(scope="module")
def tiny_hybrid(tiny_checkpoints, tmp_path_factory):
    """An untrained hybrid cut at layer 2 of the tiny Llama (enough to exercise the whole harness)."""
    from dihal_fast.common.hf_loading import load_causal_lm
    from dihal_fast.hybrid.model import HybridLM

    model, tokenizer = load_causal_lm(tiny_checkpoints["llama"])
    torch.manual_seed(0)
    hybrid = HybridLM.from_backbone(model, 2, tokenizer=tokenizer, backbone_dir=tiny_checkpoints["llama"])
    return hybrid.save_pretrained(tmp_path_factory.mktemp("hybrid") / "hybrid")


def _evaluate_argv(hybrid, corpus, out, evaluator, backbone=None):
    return [
        "evaluate",
        "--hybrid",
        str(hybrid),
        *(["--backbone", str(backbone)] if backbone is not None else []),
        "--corpus",
        str(corpus),
        "--out",
        str(out),
        "--evaluator",
        str(evaluator),
        "--seq-len",
        "24",
        "--eval-blocks",
        "3",
        "--n-samples",
        "3",
        "--max-new-tokens",
        "8",
        "--nfe",
        "2",
        "--diffusion-lm-steps",
        "5",
    ]


def test_evaluate_cli_writes_every_section_and_resumes(tiny_hybrid, tiny_checkpoints, corpus, tmp_path, capsys):
    from dihal_fast.cli import main
    from dihal_fast.common import read_json

    out = tmp_path / "run"
    assert main(_evaluate_argv(tiny_hybrid, corpus, out, *[tiny_checkpoints["llama"]] * 2)) == 0
    report = read_json(out / "evaluate.json")
    for name in ("backbone", "hybrid"):
        for key in ("nll", "ppl", "kl", "gen_ppl", "entropy", "diversity_dihal", "diversity_ld4lg", "tokens_per_s"):
            assert math.isfinite(report[name][key]), (name, key)
    assert report["backbone"]["kl"] == 0.0 and report["hybrid"]["kl"] > 0
    assert report["hybrid"]["kind"] == "hybrid" and report["controls"]["diffusion_lm"]["nll"] is None
    assert set(report["samples"]) == {"backbone", "hybrid", "diffusion_lm"} and len(report["samples"]["hybrid"]) == 3
    assert "first token" in report["protocol"]["nll"] and report["evaluator"]["dtype"] == "float32"
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "sections").iterdir()}
    assert main(_evaluate_argv(tiny_hybrid, corpus, out, *[tiny_checkpoints["llama"]] * 2)) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (out / "sections").iterdir()} == stamps  # reused, not recomputed
    assert read_json(out / "evaluate.json")["hybrid"] == report["hybrid"]


def test_evaluate_cli_bad_input(tiny_hybrid, tiny_checkpoints, corpus, tmp_path, capsys):
    from dihal_fast.cli import main
    from dihal_fast.testing import make_tiny_checkpoint

    other = make_tiny_checkpoint(tmp_path / "other", "llama", vocab_size=300)
    assert main(_evaluate_argv(tiny_hybrid, corpus, tmp_path / "a", other, tiny_checkpoints["llama"])) == 2
    assert "tokenizer differs" in capsys.readouterr().err
    assert main(_evaluate_argv(tiny_checkpoints["llama"], corpus, tmp_path / "b", tiny_checkpoints["llama"])) == 2
    assert "not a hybrid" in capsys.readouterr().err


def _replace_run(tmp_path, hybrid, result):
    """A run directory whose result.json is ``result`` (``hybrid_dir`` pointing at ``hybrid`` when given)."""
    from dihal_fast.common import atomic_write_json

    run = tmp_path / "replace_run"
    run.mkdir()
    atomic_write_json(run / "result.json", result)
    return run


def test_a_replace_run_names_its_hybrid_and_backbone(tiny_hybrid, tiny_checkpoints, tmp_path):
    from dihal_fast.evaluate.models import resolve_models

    backbone = tiny_checkpoints["llama"]
    run = _replace_run(tmp_path, tiny_hybrid, {"hybrid_dir": str(tiny_hybrid), "model": str(backbone)})
    models = resolve_models(run)
    assert (models.hybrid, models.backbone) == (tiny_hybrid, backbone)
    copy = shutil.copytree(backbone, tmp_path / "backbone_copy")
    assert resolve_models(run, backbone=copy).backbone == copy  # explicit wins
    assert resolve_models(tiny_hybrid, backbone).hybrid == tiny_hybrid


def test_the_backbone_is_never_the_provenance_path(tiny_hybrid, tiny_checkpoints, tmp_path):
    """A hybrid directory alone, or a run written before result.json named its model, is one line asking for
    --backbone; a run without a hybrid_dir or whose hybrid moved is one line too."""
    from dihal_fast.evaluate.models import resolve_models

    with pytest.raises(ValueError, match="pass --backbone"):
        resolve_models(tiny_hybrid)
    old = _replace_run(tmp_path, tiny_hybrid, {"hybrid_dir": str(tiny_hybrid)})
    with pytest.raises(ValueError, match="pass --backbone"):
        resolve_models(old)
    (old / "result.json").write_text('{"layer": 2}')
    with pytest.raises(ValueError, match="names no hybrid"):
        resolve_models(old)
    (old / "result.json").write_text('{"hybrid_dir": "moved"}')
    with pytest.raises(ValueError, match="holds no saved hybrid"):
        resolve_models(old)


def test_the_hybrid_is_built_on_the_one_loaded_backbone(tiny_hybrid, tiny_checkpoints):
    """No second copy of the backbone: the hybrid's frozen tensors are the backbone's own storage, the only
    new parameters are the bridge's, the logits equal the self-contained hybrid's, and an evaluator that is
    the backbone in its dtype is the same loaded model."""
    from dihal_fast.evaluate.loaded_lm import load_lm
    from dihal_fast.evaluate.models import load_backbone_and_evaluator, load_hybrid_on, resolve_models

    models = resolve_models(tiny_hybrid, tiny_checkpoints["llama"], evaluator=tiny_checkpoints["llama"])
    backbone, evaluator = load_backbone_and_evaluator(models)
    assert evaluator is backbone
    hybrid = load_hybrid_on(backbone, models.hybrid)
    shared = {p.data_ptr() for p in backbone.model.parameters()}
    new = [(n, p) for n, p in hybrid.model.named_parameters() if p.data_ptr() not in shared]
    assert new and all(n.startswith("bridge.") for n, _ in new)
    alone = load_lm(tiny_hybrid)
    ids = torch.arange(3, 19)[None]
    torch.testing.assert_close(hybrid.logits(ids, torch.ones_like(ids)), alone.logits(ids, torch.ones_like(ids)))
    _, other = load_backbone_and_evaluator(
        resolve_models(tiny_hybrid, tiny_checkpoints["llama"], tiny_checkpoints["llama"], evaluator_dtype="float64")
    )
    assert other is not backbone and other.model.dtype == torch.float64


def test_a_hybrid_on_another_backbone_is_refused(tiny_hybrid, tiny_checkpoints):
    from dihal_fast.evaluate.loaded_lm import load_lm
    from dihal_fast.evaluate.models import load_hybrid_on

    other = load_lm(tiny_checkpoints["llama"])
    with torch.no_grad():
        other.model.model.norm.weight.add_(1.0)  # a retained tensor the hybrid holds a copy of
    with pytest.raises(ValueError, match="differs from the one the hybrid"):
        load_hybrid_on(other, tiny_hybrid)


def test_saved_tensors_are_read_without_a_memory_map(tiny_hybrid, monkeypatch):
    """The hybrid's saved copy is read tensor by tensor with plain reads, the same values safetensors loads; a
    memory map (safe_open) would put the whole file in the process's RSS while it is compared."""
    import safetensors
    from safetensors.torch import load_file

    from dihal_fast.evaluate.models import _saved_tensors

    expected = load_file(str(tiny_hybrid / "model.safetensors"))
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: pytest.fail("memory-mapped the hybrid's file"))
    read = dict(_saved_tensors(tiny_hybrid))
    assert read.keys() == expected.keys()
    for name, value in expected.items():
        assert read[name].dtype == value.dtype and torch.equal(read[name], value), name


def test_a_backbone_of_another_shape_is_refused_before_loading(tiny_hybrid, tiny_checkpoints, tmp_path):
    """--backbone, or the model a replace run names, of another shape than the hybrid's recorded backbone: one
    line naming the fields and --backbone, before any weights load; through the stage (the API) too."""
    from dihal_fast.evaluate.models import resolve_models
    from dihal_fast.pipeline import EvaluateConfig, evaluate

    with pytest.raises(ValueError, match=r"--backbone .* was cut from: model_type 'gpt2'.*pass that checkpoint"):
        resolve_models(tiny_hybrid, tiny_checkpoints["gpt2"])
    run = _replace_run(tmp_path, tiny_hybrid, {"hybrid_dir": str(tiny_hybrid), "model": str(tiny_checkpoints["qwen3"])})
    with pytest.raises(ValueError, match=r"result.json names, .*model_type 'qwen3'.* as --backbone"):
        resolve_models(run)
    with pytest.raises(ValueError, match="pass --backbone DIR .*its config records /"):
        evaluate(EvaluateConfig(hybrid=str(tiny_hybrid)), tmp_path / "eval")
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        evaluate(EvaluateConfig(hybrid=str(tiny_hybrid), backbone=str(tiny_checkpoints["gpt2"])), tmp_path / "e2")
