"""Every load is whole or refused in one line: a backbone or a hybrid whose weights lack a tensor, hold one
without a place or of another shape, whose config names more layers than the weights hold (a million refused
before anything is allocated), a hybrid relabelled as a llama, hybrid config fields out of range; and load
errors that are not the files' fault (a CUDA device_map on a CPU machine, FlashAttention without a GPU) say
what they are, translated once and chained."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.errors import DihalValueError
from dihal_fast.hybrid import HybridLM

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


@pytest.fixture(scope="module")
def hybrid_dir(tiny_checkpoints, tmp_path_factory):
    model, tokenizer = load_causal_lm(tiny_checkpoints["llama"])
    torch.manual_seed(0)
    hybrid = HybridLM.from_backbone(model, 2, {"width": 32, "heads": 2}, tokenizer, tiny_checkpoints["llama"])
    return hybrid.save_pretrained(tmp_path_factory.mktemp("hybrid") / "h")


def _copy(source, tmp_path, name: str = "copy"):
    return shutil.copytree(source, tmp_path / name)


def _edit_weights(directory, edit) -> None:
    tensors = load_file(str(directory / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


def _edit_config(directory, edit) -> None:
    config = json.loads((directory / "config.json").read_text())
    edit(config)
    (directory / "config.json").write_text(json.dumps(config))


def _refused(call, *fragments: str) -> str:
    with pytest.raises(DihalValueError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and "corrupt" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_a_backbone_missing_a_tensor_is_refused_naming_it(tiny_checkpoints, tmp_path):
    path = _copy(tiny_checkpoints["llama"], tmp_path)
    _edit_weights(path, lambda tensors: tensors.pop("model.layers.1.mlp.up_proj.weight"))
    _refused(lambda: load_causal_lm(path), "missing model.layers.1.mlp.up_proj.weight")


def test_a_backbone_with_an_unexpected_or_reshaped_tensor_is_refused(tiny_checkpoints, tmp_path):
    path = _copy(tiny_checkpoints["llama"], tmp_path)
    _edit_weights(path, lambda tensors: tensors.update({"model.extra.weight": torch.zeros(2)}))
    _refused(lambda: load_causal_lm(path), "unexpected model.extra.weight")
    path = _copy(tiny_checkpoints["llama"], tmp_path, "reshaped")
    _edit_weights(path, lambda tensors: tensors.update({"model.norm.weight": torch.ones(33)}))
    _refused(lambda: load_causal_lm(path), "model.norm.weight (stored [33], expected [32])")


@pytest.mark.parametrize("layers", [5, 1_000_000])
def test_more_layers_than_the_weights_hold_are_refused_before_allocation(
    tiny_checkpoints, tmp_path, monkeypatch, layers
):
    path = _copy(tiny_checkpoints["llama"], tmp_path)
    _edit_config(path, lambda config: config.update(num_hidden_layers=layers))

    def no_build(*args, **kwargs):
        raise AssertionError("the model was built before the layer count was checked")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_build)
    start = time.perf_counter()
    _refused(lambda: load_causal_lm(path), f"num_hidden_layers = {layers}", "weights hold 4 layers (model.layers.0..3)")
    assert time.perf_counter() - start < 30


def test_a_config_wider_than_its_weights_is_refused_before_allocation(tiny_checkpoints, tmp_path, monkeypatch):
    path = _copy(tiny_checkpoints["llama"], tmp_path)
    _edit_config(path, lambda config: config.update(intermediate_size=1_000_000))
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *args, **kwargs: pytest.fail("allocated"))
    _refused(
        lambda: load_causal_lm(path),
        "refused before allocating",
        "model.layers.0.mlp.down_proj.weight (stored [32, 64], expected [32, 1000000])",
    )


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("bridge.context_layers", 1_000_000, "bridge.context_layers = 1000000, but its weights hold 2 context blocks"),
        ("bridge.width", 4096, "bridge.condition_in.weight (stored [32, 32], expected [4096, 32])"),
        ("upper.intermediate_size", 10**6, "upper.model.layers.0.mlp.down_proj.weight (stored [32, 64], expected"),
    ],
)
def test_a_hybrid_config_larger_than_its_weights_is_refused_before_allocation(
    hybrid_dir, tmp_path, monkeypatch, field, value, fragment
):
    path = _copy(hybrid_dir, tmp_path)
    part, name = field.split(".")
    _edit_config(path, lambda config: config[part].update({name: value}))
    original = HybridLM.__init__

    def on_meta_only(self, config):
        assert torch.empty(0).device.type == "meta", "a hybrid was allocated before the check"
        original(self, config)

    monkeypatch.setattr(HybridLM, "__init__", on_meta_only)
    _refused(lambda: HybridLM.from_pretrained(path), fragment)


def test_a_hybrid_missing_a_bridge_tensor_is_refused(hybrid_dir, tmp_path):
    path = _copy(hybrid_dir, tmp_path)
    _edit_weights(path, lambda tensors: tensors.pop("bridge.out.weight"))
    for load in (lambda: HybridLM.from_pretrained(path), lambda: AutoModelForCausalLM.from_pretrained(path)):
        _refused(load, "missing bridge.out.weight")
    message = _refused(lambda: load_causal_lm(path), "missing bridge.out.weight")
    assert "DihalValueError" not in message  # translated once, not wrapped again by the backbone loader


def test_a_hybrid_retaining_more_layers_than_stored_is_refused_before_allocation(hybrid_dir, tmp_path, monkeypatch):
    path = _copy(hybrid_dir, tmp_path)

    def more_layers(config):
        config["upper"]["num_hidden_layers"] = 1_000_000
        config.update(backbone_layers=1_000_002, num_hidden_layers=1_000_000)
        config["backbone_config"]["num_hidden_layers"] = 1_000_002

    _edit_config(path, more_layers)
    monkeypatch.setattr(HybridLM, "__init__", lambda *args, **kwargs: pytest.fail("built before the check"))
    _refused(lambda: HybridLM.from_pretrained(path), "upper.num_hidden_layers = 1000000", "weights hold 2 layers")


def test_a_hybrid_relabelled_as_a_llama_is_refused(hybrid_dir, tmp_path):
    path = _copy(hybrid_dir, tmp_path)
    _edit_config(path, lambda config: config.update(model_type="llama"))
    _refused(lambda: load_causal_lm(path), "missing", "unexpected bridge.")


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("layer", 0, "layer must be an integer in 1..3"),
        ("layer", 99, "layer must be an integer in 1..3"),
        ("layer", True, "layer must be an integer in 1..3"),
        ("noise_seed", -5, "noise_seed must be an integer in 0..2**63-1"),
        ("noise_seed", float("inf"), "noise_seed must be an integer in 0..2**63-1"),
        ("noise_seed", 1.5, "noise_seed must be an integer in 0..2**63-1"),
        ("stochastic_noise", "yes", "stochastic_noise must be true or false"),
        ("num_hidden_layers", 3, "num_hidden_layers is 3, its retained part's (upper) 2"),
        ("bridge.nfe", 10**9, "bridge.nfe (denoising steps) must be an integer in 1..1000"),
        ("bridge.nfe", 0, "bridge.nfe (denoising steps) must be an integer in 1..1000"),
        ("upper.num_hidden_layers", 9, "upper.num_hidden_layers is 9; a cut at layer 2 of a 4-layer backbone"),
    ],
)
def test_hybrid_config_fields_out_of_range_are_refused(hybrid_dir, tmp_path, field, value, fragment):
    path = _copy(hybrid_dir, tmp_path)

    def edit(config):
        *parents, name = field.split(".")
        target = config
        for parent in parents:
            target = target[parent]
        target[name] = value

    _edit_config(path, edit)
    _refused(lambda: HybridLM.from_pretrained(path), fragment)


def test_forward_arguments_out_of_range_are_refused(hybrid_dir):
    model = HybridLM.from_pretrained(hybrid_dir)
    ids = torch.tensor([[1, 40, 50]])
    _refused(lambda: model(ids, nfe=10**9), "nfe (denoising steps) must be an integer in 1..1000")
    _refused(lambda: model(ids, seed=-1), "seed must be an integer in 0..2**63-1")
    _refused(lambda: model(ids, seed=True), "seed must be an integer")


def test_loading_info_is_returned_as_transformers_does(hybrid_dir):
    model, info = HybridLM.from_pretrained(hybrid_dir, output_loading_info=True)
    assert isinstance(model, HybridLM) and model.tokenizer is not None
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    model, info = AutoModelForCausalLM.from_pretrained(hybrid_dir, output_loading_info=True)
    assert isinstance(model, HybridLM) and not info["missing_keys"]


@NO_CUDA
def test_a_cuda_device_map_on_a_cpu_machine_says_so(hybrid_dir):
    for load in (HybridLM.from_pretrained, AutoModelForCausalLM.from_pretrained):
        _refused(lambda load=load: load(hybrid_dir, device_map="cuda:0"), "device_map 'cuda:0'", "no CUDA device")
    _refused(lambda: HybridLM.from_pretrained(hybrid_dir, device="cuda"), "no CUDA device")


@NO_CUDA
def test_flash_attention_without_a_gpu_says_so(hybrid_dir):
    for load in (HybridLM.from_pretrained, AutoModelForCausalLM.from_pretrained):
        _refused(
            lambda load=load: load(hybrid_dir, attn_implementation="flash_attention_2"),
            "attn_implementation='flash_attention_2' needs a CUDA GPU",
        )


def test_a_damaged_weight_file_is_corrupt_and_chained(tiny_checkpoints, tmp_path):
    path = _copy(tiny_checkpoints["llama"], tmp_path)
    (path / "model.safetensors").write_bytes(b"\x00" * 50)
    with pytest.raises(DihalValueError, match="model.safetensors is corrupt: not a safetensors file"):
        load_causal_lm(path)
    path = _copy(tiny_checkpoints["llama"], tmp_path, "no_weights")
    (path / "model.safetensors").unlink()
    with pytest.raises(DihalValueError, match="could not load a causal LM from") as caught:
        load_causal_lm(path)
    assert isinstance(caught.value.__cause__, OSError)


def test_the_cli_refuses_incomplete_weights_in_one_line(hybrid_dir, tmp_path, capsys):
    from dihal_fast.cli import main

    path = _copy(hybrid_dir, tmp_path)
    _edit_weights(path, lambda tensors: tensors.pop("upper.model.norm.weight"))
    assert main(["generate", "--model", str(path), "--prompt", "Once", "--max-new-tokens", "2"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "missing upper.model.norm.weight" in errors[0]


def test_the_evaluators_are_loaded_whole(tiny_checkpoints, tmp_path, monkeypatch):
    from dihal_fast.evaluate.loaded_lm import load_lm
    from dihal_fast.hcdlm import scoring

    path = _copy(tiny_checkpoints["llama"], tmp_path)
    _edit_weights(path, lambda tensors: tensors.pop("model.norm.weight"))
    _refused(lambda: load_lm(path), "missing model.norm.weight")  # dihal evaluate's --evaluator, --backbone
    monkeypatch.setattr(scoring, "sample_targets", lambda *args: ([], 0.0))  # no HC-DLM run needed to get there
    _refused(lambda: scoring.evaluate_text(None, 0, None, path), "missing model.norm.weight")
