"""The rehearsal's checkpoints (bench/make_rehearsal_model.py) and the memory terms of docs/DESIGN.md, "Memory at
size", on a small bfloat16 shape: weights stay in their dtype, one backbone per evaluation, and the pipeline
runs end to end as a user runs it (slow)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import make_rehearsal_model as rehearsal  # noqa: E402 (from bench/, put on sys.path above)

SMALL = {
    "llama": rehearsal.Shape("llama", 3, 64, 128, 4, 2, 16),
    "qwen3": rehearsal.Shape("qwen3", 3, 64, 128, 4, 2, 16),
}
TEXT = "\n\n".join(f"Story {i}: once upon a time a fox and a dog went to the river {i % 7}." for i in range(200))


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("text")
    (directory / "stories.train.txt").write_text(TEXT)
    return directory


@pytest.fixture(scope="module")
def small_models(text_dir, tmp_path_factory, monkeypatch_module):
    """Rehearsal checkpoints of both families at a small shape: bf16, sharded, a 400-token BPE."""
    root = tmp_path_factory.mktemp("rehearsal")
    tokenizer = rehearsal.train_tokenizer(text_dir, 400)
    for name, shape in SMALL.items():
        monkeypatch_module.setitem(rehearsal.SHAPES, name, shape)
        rehearsal.write_checkpoint(name, root, tokenizer, shard_size="100KB")
    return {name: root / name for name in SMALL}


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.mark.parametrize("family", sorted(SMALL))
def test_rehearsal_checkpoint_is_bf16_sharded_and_named(small_models, family):
    from dihal_fast.common.hf_loading import load_causal_lm

    directory = small_models[family]
    assert len(list(directory.glob("model-*-of-*.safetensors"))) > 1
    config = json.loads((directory / "config.json").read_text())
    assert config["rehearsal"] == "random weights" and config["tie_word_embeddings"]
    assert "random weights" in (directory / "REHEARSAL.md").read_text()
    model, tokenizer = load_causal_lm(directory, "auto")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}  # auto keeps the checkpoint's dtype
    assert sum(p.numel() for p in model.parameters()) == SMALL[family].parameters(len(tokenizer))
    if family == "qwen3":
        assert model.model.layers[0].self_attn.q_norm.weight.shape == (16,)


def test_random_weights_are_allocated_in_bf16_only(monkeypatch):
    """The builder never makes a float32 weight: every tensor the model allocates is bfloat16."""
    seen = set()
    original = torch.Tensor.normal_

    def spy(self, *args, **kwargs):
        seen.add(self.dtype)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "normal_", spy)
    model = rehearsal.random_model(SMALL["llama"], 400)
    assert seen == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def allocated_bytes(fn):
    """``fn()`` and the bytes of every CPU tensor that a factory op (``empty``, ``zeros``, ...) made during it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    made = []

    class Factories(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if torch.Tag.nondeterministic_seeded not in func.tags and func.overloadpacket.__name__.startswith(
                ("empty", "zeros", "ones", "full")
            ):
                if isinstance(out, torch.Tensor) and out.device.type == "cpu":
                    made.append(out.numel() * out.element_size())
            return out

    with Factories():
        result = fn()
    return result, sum(made)


@pytest.mark.parametrize("family", sorted(SMALL))
def test_building_the_hybrid_allocates_the_bridge_only(small_models, family):
    """A hybrid with frozen retained layers takes the backbone's tensors: building it allocates the bridge and
    nothing of the size of the retained layers (their randomly initialised copy, freed at once, raised every
    training stage's peak by the retained layers' bytes: ZeRO-3 1.51x the accounted memory at Llama-3.2-1B's
    shape)."""
    from dihal_fast.common.hf_loading import load_causal_lm
    from dihal_fast.hybrid import HybridLM, backbone_targets

    backbone, tokenizer = load_causal_lm(small_models[family], "float32")
    hybrid, made = allocated_bytes(lambda: HybridLM.from_backbone(backbone, 1, {}, tokenizer))
    bridge = sum(p.numel() * p.element_size() for p in hybrid.bridge.parameters())
    retained = sum(p.numel() * p.element_size() for p in hybrid.upper.parameters())
    assert retained > bridge / 2  # the shape makes a copy of the retained part visible
    assert made < bridge + retained / 2, (made, bridge, retained)
    backbone_storage = {p.data_ptr() for p in backbone.parameters()} | {b.data_ptr() for b in backbone.buffers()}
    assert all(p.data_ptr() in backbone_storage for p in hybrid.upper.parameters())
    assert not any(t.is_meta for t in [*hybrid.parameters(), *hybrid.buffers()])
    ids = torch.tensor([[3, 5, 7, 11, 13]])
    hidden, logits = backbone_targets(backbone, ids, 1)  # the retained part fed the true h_1 is the backbone
    rebuilt = hybrid.decode(hidden, None, torch.arange(5)[None]).to(logits.dtype)
    torch.testing.assert_close(rebuilt, logits, rtol=1e-4, atol=1e-4)


def test_evaluate_holds_one_bf16_backbone(small_models, tmp_path):
    """evaluate on a bf16 backbone: the evaluator (the backbone, default dtype) is the same loaded model,
    nothing is upcast, and the hybrid adds only its bridge, in bf16 (bridge_dtype auto) or float32 when asked."""
    from dihal_fast.common.hf_loading import load_causal_lm
    from dihal_fast.evaluate.models import load_backbone_and_evaluator, load_hybrid_on, resolve_models
    from dihal_fast.hybrid import HybridLM
    from dihal_fast.pipeline.evaluate_stage import EvaluateConfig

    directory = small_models["llama"]
    backbone, tokenizer = load_causal_lm(directory, "auto")
    hybrid_dir = HybridLM.from_backbone(backbone, 1, {"width": 32, "heads": 2}, tokenizer).save_pretrained(
        tmp_path / "hybrid"
    )
    default = EvaluateConfig(hybrid="h").evaluator_dtype
    models = resolve_models(hybrid_dir, directory, evaluator=directory, evaluator_dtype=default)
    loaded, evaluator = load_backbone_and_evaluator(models)
    assert evaluator is loaded and loaded.model.dtype == torch.bfloat16
    backbone_storage = {p.data_ptr() for p in loaded.model.parameters()}
    for bridge_dtype, dtype in ((None, torch.bfloat16), ("float32", torch.float32)):
        hybrid = load_hybrid_on(loaded, models.hybrid, bridge_dtype=bridge_dtype)
        extra = {n: p.dtype for n, p in hybrid.model.named_parameters() if p.data_ptr() not in backbone_storage}
        assert extra and all(n.startswith("bridge.") and d == dtype for n, d in extra.items())


@pytest.mark.slow
def test_the_pipeline_runs_on_a_bf16_sharded_checkpoint(small_models, text_dir, tmp_path):
    """locate (every layer), replace, evaluate (the run directory names hybrid and backbone) and generate, as
    a user runs them, on the small Qwen3-shaped rehearsal checkpoint."""
    from dihal_fast.cli import main
    from dihal_fast.common import read_json

    model, corpus = str(small_models["qwen3"]), str(text_dir)
    run = tmp_path / "run"
    common = ["--model", model, "--corpus", corpus]
    locate = ["locate", *common, "--max-tokens", "2048", "--sample-size", "400", "--repeats", "2"]
    assert main([*locate, "--seq-len", "32", "--out", str(run / "locate")]) == 0
    train = ["--steps", "2", "--batch-size", "2", "--seq-len", "32", "--val-blocks", "2", "--stats-blocks", "2"]
    replace = ["replace", *common, "--from-locate", str(run / "locate"), *train, "--out", str(run / "replace")]
    assert main(replace) == 0
    result = read_json(run / "replace" / "result.json")
    assert Path(result["model"]) == Path(model).resolve()
    evaluate = ["evaluate", "--hybrid", str(run / "replace"), "--evaluator", model, "--corpus", corpus]
    sizes = ["--seq-len", "32", "--eval-blocks", "2", "--n-samples", "2", "--max-new-tokens", "4"]
    assert main([*evaluate, *sizes, "--out", str(run / "evaluate")]) == 0
    report = read_json(run / "evaluate" / "evaluate.json")
    assert report["evaluator"]["dtype"] == "bfloat16" and report["hybrid"]["ppl"] > 1
    generate = ["generate", "--model", str(run / "replace"), "--prompt", "Once", "--max-new-tokens", "4"]
    assert main(generate) == 0
