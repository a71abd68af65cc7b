"""The hybrid as a transformers model on a tiny Llama: the Auto classes in a fresh process that never imports
dihal_fast itself, pipeline("text-generation"), a moved directory, the checkpoint's dtype, and directories in
the earlier layout (refused with the conversion command, then converted)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.hybrid import HybridLM
from dihal_fast.testing import make_tiny_checkpoint

PROMPT = "The quick brown fox"


def _cut(backbone_dir, layer: int = 2, dtype: torch.dtype = torch.float32) -> HybridLM:
    # loaded in ``dtype`` as the pipeline loads it (its rotary tables stay float32, as in a loaded hybrid; a
    # model cast with .to(bfloat16) has bf16 ones, which the hybrid would share)
    model, tokenizer = load_causal_lm(backbone_dir, str(dtype).removeprefix("torch."))
    torch.manual_seed(0)
    hybrid = HybridLM.from_backbone(model, layer, {"width": 32, "heads": 2}, tokenizer, backbone_dir)
    torch.nn.init.normal_(hybrid.bridge.out.weight, std=0.3)  # a fresh bridge outputs the mean: make it depend on x
    return hybrid.eval()


@pytest.fixture(scope="module")
def saved(tiny_checkpoints, tmp_path_factory):
    """``(hybrid, directory)``: a tiny hybrid and its saved directory."""
    hybrid = _cut(tiny_checkpoints["llama"])
    return hybrid, hybrid.save_pretrained(tmp_path_factory.mktemp("hybrid") / "hybrid")


def test_directory_is_a_transformers_checkpoint_without_absolute_paths(saved):
    _, directory = saved
    config = json.loads((directory / "config.json").read_text())
    assert (
        config["model_type"] == "dihal_hybrid" and config["auto_map"]["AutoModelForCausalLM"] == "dihal_hybrid.HybridLM"
    )
    assert (directory / "dihal_hybrid.py").is_file() and (directory / "model.safetensors").is_file()
    paths = [value for value in json.dumps(config).split('"') if value.startswith("/")]
    assert paths == [config["backbone_dir"]]  # the backbone's path is provenance only


def test_auto_classes_load_it_in_a_fresh_process(saved, tmp_path):
    hybrid, directory = saved
    script = textwrap.dedent(f"""
        import json, sys, torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
        config = AutoConfig.from_pretrained(sys.argv[1], trust_remote_code=True)
        model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
        ids = AutoTokenizer.from_pretrained(sys.argv[1])({PROMPT!r}, return_tensors="pt").input_ids
        with torch.no_grad():
            losses = [model(ids, labels=ids).loss.item() for _ in range(2)]
        greedy = [model.generate(ids, max_new_tokens=5, do_sample=False).tolist() for _ in range(2)]
        print(json.dumps({{"config": type(config).__name__, "model": type(model).__name__, "losses": losses,
                          "greedy": greedy, "dtype": str(model.dtype), "device": str(model.device),
                          "parameters": model.num_parameters()}}))
    """)
    env = {
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "PATH": "/usr/bin:/bin",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", script, str(directory)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    ids = AutoTokenizer.from_pretrained(directory)(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        loss = hybrid(ids, labels=ids).loss.item()
    assert (result["config"], result["model"]) == ("HybridConfig", "HybridLM")
    assert result["losses"][0] == result["losses"][1] == pytest.approx(loss, rel=1e-6)
    assert (
        result["greedy"][0] == result["greedy"][1] == hybrid.generate(ids, max_new_tokens=5, do_sample=False).tolist()
    )
    assert (
        result["dtype"] == "torch.float32"
        and result["device"] == "cpu"
        and result["parameters"] == hybrid.num_parameters()
    )


def test_registered_auto_classes_and_pipeline(saved):
    from transformers import pipeline

    hybrid, directory = saved
    model = AutoModelForCausalLM.from_pretrained(directory)  # registered on import of dihal_fast.hybrid
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert isinstance(model, HybridLM) and model.generation_config.eos_token_id == tokenizer.eos_token_id
    out = pipeline("text-generation", model=model, tokenizer=tokenizer)(PROMPT, max_new_tokens=4, do_sample=False)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    expected = tokenizer.decode(hybrid.generate(ids, max_new_tokens=4, do_sample=False)[0], skip_special_tokens=True)
    assert out[0]["generated_text"] == expected


def test_moved_directory_loads_and_generates_without_its_backbone(tiny_checkpoints, tmp_path, capsys):
    from dihal_fast.cli import main

    backbone = shutil.copytree(tiny_checkpoints["llama"], tmp_path / "backbone")
    directory = _cut(backbone).save_pretrained(tmp_path / "hybrid")
    moved = shutil.move(str(directory), str(tmp_path / "elsewhere"))
    shutil.rmtree(backbone)
    model = AutoModelForCausalLM.from_pretrained(moved)
    assert model.generate(torch.tensor([[1, 40, 50]]), max_new_tokens=3, do_sample=False).shape == (1, 6)
    assert main(["generate", "--model", moved, "--prompt", "Once", "--n-samples", "1", "--max-new-tokens", "4"]) == 0
    assert "tokens/s (hybrid)" in capsys.readouterr().out
    assert main(["evaluate", "--hybrid", moved, "--out", str(tmp_path / "eval")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "pass --backbone DIR" in errors[0]


def test_the_checkpoint_dtype_is_kept_and_the_bridge_follows_it_or_stays_float32(tiny_checkpoints, tmp_path):
    hybrid = _cut(tiny_checkpoints["llama"], dtype=torch.bfloat16)
    assert hybrid.dtype == torch.bfloat16 and hybrid.bridge.dtype == torch.float32  # as built for training
    directory = hybrid.save_pretrained(tmp_path / "bf16")
    ids = torch.tensor([[1, 40, 50, 60, 7, 9, 11]])
    with torch.no_grad():
        reference = hybrid(ids).logits
        kept = AutoModelForCausalLM.from_pretrained(directory, bridge_dtype="float32")
        assert kept.dtype == torch.bfloat16 and kept.bridge.dtype == torch.float32
        assert torch.equal(kept(ids).logits, reference) and reference.dtype == torch.bfloat16
        assert kept.generate(ids, max_new_tokens=3, do_sample=False).shape == (1, 10)
        # the default (auto; transformers' convention: a config attribute as a from_pretrained keyword, lm-eval's
        # model_args too): the bridge in the checkpoint's dtype, its statistics float32
        loaded = AutoModelForCausalLM.from_pretrained(directory)
        assert loaded.dtype == loaded.bridge.dtype == torch.bfloat16 and loaded.config.bridge_dtype == "auto"
        assert loaded.bridge.target_mean.dtype == torch.float32
        logits = loaded(ids).logits.float()
        assert 0 < (logits - reference.float()).abs().max() < 0.1 * reference.float().abs().max()  # bf16 rounding
        hybrid.use_bridge_dtype("auto")  # the same, on a model in memory
        assert hybrid.bridge.dtype == torch.bfloat16 and torch.equal(hybrid(ids).logits.float(), logits)
        half = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float16)
        assert half.dtype == torch.float16 and half.bridge.dtype == torch.float32  # fp16's range: never checked
    with pytest.raises(ValueError, match="its float32 weights are gone"):
        hybrid.use_bridge_dtype("float32")  # rounded weights would pass for the trained ones
    with pytest.raises(ValueError, match="bridge_dtype must be one of float32, auto"):
        AutoModelForCausalLM.from_pretrained(directory, bridge_dtype="bfloat16")


def _write_earlier_layout(hybrid: HybridLM, directory) -> None:
    """What ``HybridLM.save_pretrained`` wrote before the transformers model (hybrid_config.json + parts)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    save_file(
        {k: v.float().contiguous() for k, v in hybrid.bridge.state_dict().items()},
        str(directory / "bridge.safetensors"),
    )
    hybrid.upper.save_pretrained(directory / "upper")
    (directory / "backbone_config.json").write_text(json.dumps(hybrid.config.backbone_config))
    hybrid.tokenizer.save_pretrained(directory)
    config = hybrid.config
    (directory / "hybrid_config.json").write_text(
        json.dumps(
            {
                "family": config.family,
                "layer": config.layer,
                "backbone_layers": config.backbone_layers,
                "backbone_dir": config.backbone_dir,
                "max_position_embeddings": config.max_position_embeddings,
                "bridge": hybrid.bridge.config.to_dict(),
                "freeze_upper": True,
                "format": "dihal_fast.hybrid",
            }
        )
    )


def test_earlier_layout_is_refused_with_the_conversion_and_converts(saved, tmp_path, capsys):
    from dihal_fast.cli import main
    from dihal_fast.hybrid.legacy import main as convert

    hybrid, _ = saved
    old = tmp_path / "run" / "hybrid"
    _write_earlier_layout(hybrid, old)
    for call in (lambda: HybridLM.from_pretrained(old), lambda: AutoModelForCausalLM.from_pretrained(old)):
        with pytest.raises((ValueError, OSError)):
            call()
    with pytest.raises(ValueError, match=f"python -m dihal_fast.hybrid.legacy {old}$"):
        HybridLM.from_pretrained(old)
    assert main(["generate", "--model", str(old), "--max-new-tokens", "2"]) == 2
    assert "python -m dihal_fast.hybrid.legacy" in capsys.readouterr().err
    assert convert([str(old)]) == 0
    converted = HybridLM.from_pretrained(old)
    ids = torch.tensor([[1, 40, 50, 60, 70]])
    with torch.no_grad():
        assert torch.equal(converted(ids, seed=3).logits, hybrid(ids, seed=3).logits)
    assert not (old / "hybrid_config.json").exists() and not (old / "upper").exists()


def test_a_bf16_backbone_checkpoint_gives_a_bf16_hybrid_through_replace_export(tmp_path):
    """``export_hybrid`` (what ``dihal replace`` saves) keeps the backbone's dtype."""
    from dihal_fast.bridge import BridgeConfig
    from dihal_fast.replace.job import export_hybrid

    path = make_tiny_checkpoint(tmp_path / "bf16", "llama")
    model, tokenizer = load_causal_lm(path, dtype="bfloat16")
    bridge = BridgeConfig(hidden_size=32, condition_size=32, layer=1, width=32, heads=2)
    hybrid = export_hybrid(model, tokenizer, 1, bridge, path, False, {})
    assert hybrid.dtype == torch.bfloat16 and hybrid.bridge.dtype == torch.float32


def test_the_frozen_head_on_the_last_tokens_is_one_matrix_product(tiny_checkpoints):
    """generate's prefill asks the retained model for the last token's logits only (a slice with the prompt's
    strides): the frozen head must still run as one matrix product. torch's matmul folds such a slice only when
    the weight requires grad, so it went through bmm, copying the transposed vocabulary x width weight at every
    call (a bf16 prefill at 0.38-0.46x the backbone's on a CPU, the backbone's head not being frozen)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    hybrid = _cut(tiny_checkpoints["llama"], dtype=torch.bfloat16)
    vocab = hybrid.config.vocab_size
    batched = []

    class Products(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            shapes = [a.shape for a in args if isinstance(a, torch.Tensor)]
            if func.overloadpacket.__name__ == "bmm" and any(vocab in shape for shape in shapes):
                batched.append(shapes)
            return func(*args, **(kwargs or {}))

    ids = torch.tensor([[1, 40, 50, 60, 70, 80]])
    with torch.no_grad():
        full = hybrid(ids).logits
        with Products():
            last = hybrid(ids, logits_to_keep=1).logits
    assert not batched
    torch.testing.assert_close(last, full[:, -1:])
