"""``dihal replace --device-map``: the frozen teacher and the retained layers placed by a device map train the same
bridge as the plain load (same seed: the same losses, the same saved hybrid); the spread path (the retained layers
dispatched by accelerate like the teacher's, sharing its tensors) too, run through accelerate's hooks on the CPU;
each retained layer follows its teacher layer's device; what cannot work is one line before any work."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from dihal_fast.common.devices import check_map_devices, parse_device_map
from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.hybrid import HybridLM, slicing
from dihal_fast.replace import BridgeTrainConfig, train_bridge
from dihal_fast.replace.placement import WITH_DEEPSPEED, check_replace_placement, check_teacher_placed

LAYER = 2
# Every module of the tiny Llama named (all on the CPU): a map as fine as accelerate's own.
FINE_MAP = json.dumps(
    {
        "model.embed_tokens": "cpu",
        **{f"model.layers.{i}": "cpu" for i in range(4)},
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": "cpu",
    }
)


@pytest.fixture(scope="module")
def corpus():
    """The shipped corpus (its first 2,000 tokens: ``max_train_tokens`` in :func:`_config`)."""
    from dihal_fast.common.assets import default_corpus

    return default_corpus()


def _config() -> BridgeTrainConfig:
    return BridgeTrainConfig(
        seq_len=16,
        batch_size=2,
        val_blocks=2,
        stats_blocks=4,
        steps=3,
        log_every=1,
        checkpoint_every=3,
        warmup_steps=1,
        max_train_tokens=2000,
        device="cpu",
        bridge={"width": 32, "heads": 2, "context_layers": 1, "time_dim": 16},
    )


def _run(model, corpus, out, **kwargs) -> tuple[list[dict], dict, dict[str, torch.Tensor]]:
    """Losses of every step (timings dropped), the validation report and the saved hybrid's tensors."""
    result = train_bridge(model, LAYER, corpus, out, _config(), **kwargs)
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    losses = [{k: v for k, v in r.items() if "elapsed" not in k and "time" not in k} for r in records]
    return losses, result["validation"], load_file(str(out / "hybrid" / "model.safetensors"))


@pytest.fixture(scope="module")
def plain(tiny_checkpoints, corpus, tmp_path_factory):
    return _run(tiny_checkpoints["llama"], corpus, tmp_path_factory.mktemp("plain") / "run")


def _same(run, plain) -> None:
    losses, validation, tensors = run
    assert losses == plain[0] and len(losses) == 3
    assert validation == plain[1]
    assert tensors.keys() == plain[2].keys() and all(torch.equal(tensors[k], plain[2][k]) for k in tensors)


@pytest.mark.parametrize("device_map", ["auto", "sequential", '{"": "cpu"}', FINE_MAP])
def test_a_device_map_trains_the_same_bridge(tiny_checkpoints, corpus, tmp_path, plain, device_map):
    from transformers import AutoModelForCausalLM

    run = _run(tiny_checkpoints["llama"], corpus, tmp_path / "run", device_map=device_map)
    _same(run, plain)
    hybrid = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "hybrid", trust_remote_code=True).eval()
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    assert torch.isfinite(hybrid(ids, labels=ids).loss)


def test_the_spread_path_through_accelerates_hooks_trains_the_same_bridge(
    tiny_checkpoints, corpus, tmp_path, plain, monkeypatch
):
    """The code path of a teacher spread over several GPUs, run on the CPU: the retained part is dispatched by
    accelerate with the teacher's (renumbered) map, hooks on every block, sharing the teacher's tensors; the
    engine leaves the placed objective where it is. The numbers are the plain run's."""
    from accelerate import dispatch_model

    dispatched: list = []

    def dispatch_with_hooks(model, device_map, main_device=None):
        before = {p.data_ptr() for p in model.parameters()}
        placed = dispatch_model(model, device_map, main_device=main_device, force_hooks=True)
        dispatched.append((model, dict(device_map), before == {p.data_ptr() for p in model.parameters()}))
        return placed

    teacher_map = json.loads(FINE_MAP)
    monkeypatch.setattr(slicing, "spread_map", lambda model: teacher_map)
    monkeypatch.setattr("accelerate.dispatch_model", dispatch_with_hooks)
    _same(_run(tiny_checkpoints["llama"], corpus, tmp_path / "run"), plain)
    assert dispatched, "the retained part was never dispatched"
    upper, upper_map, same_storage = dispatched[0]
    assert upper_map == slicing.upper_device_map(teacher_map, LAYER)
    assert same_storage  # dispatching copied no tensor: the retained part still shares the teacher's
    assert all(hasattr(module, "_hf_hook") for module in upper.model.layers)


def test_retained_layers_follow_their_teacher_layers_devices(tiny_checkpoints):
    from accelerate.utils import check_device_map

    backbone, tokenizer = load_causal_lm(tiny_checkpoints["llama"])
    teacher_map = {
        "model.embed_tokens": 0,
        "model.layers.0": 0,
        "model.layers.1": 0,
        "model.layers.2": 1,
        "model.layers.3.self_attn": 1,
        "model.layers.3.mlp": 2,
        "model.layers.3.input_layernorm": 2,
        "model.layers.3.post_attention_layernorm": 2,
        "model.norm": 2,
        "model.rotary_emb": 2,
        "lm_head": 2,
    }
    check_device_map(backbone, teacher_map)

    def device_of(name: str, device_map: dict) -> int:
        return next(device_map[k] for k in sorted(device_map, key=len, reverse=True) if name.startswith(k + "."))

    for layer in (1, 2, 3):
        upper = HybridLM.from_backbone(backbone, layer, {"width": 32, "heads": 2}, tokenizer).upper
        upper_map = slicing.upper_device_map(teacher_map, layer)
        check_device_map(upper, upper_map)  # every retained parameter has a device
        for name, _ in upper.named_parameters():
            teacher_name = re.sub(r"layers\.(\d+)", lambda m, cut=layer: f"layers.{int(m.group(1)) + cut}", name)
            assert device_of(name, upper_map) == device_of(teacher_name, teacher_map), (layer, name)


def test_a_json_map_loads_a_checkpoint_as_the_plain_load(tiny_checkpoints):
    """The JSON form of ``--device-map`` (also for ``dihal evaluate`` / ``generate``) goes through the one loader."""
    ids = torch.tensor([[3, 5, 7, 9, 11, 13]])
    plain, _ = load_causal_lm(tiny_checkpoints["llama"], "auto", "cpu")
    for text in ('{"": "cpu"}', FINE_MAP):
        mapped, _ = load_causal_lm(tiny_checkpoints["llama"], "auto", "cpu", text)
        with torch.no_grad():
            assert torch.equal(mapped(ids).logits, plain(ids).logits), text


def test_json_maps_parse_or_are_refused_in_one_line():
    assert parse_device_map("auto") == "auto"
    assert parse_device_map('{"": "cpu"}') == {"": "cpu"}
    assert parse_device_map('{"model": 0, "lm_head": "cuda:1"}') == {"model": 0, "lm_head": 1}
    for text, match in [
        ("everywhere", "must be one of"),
        ("{bad", "not valid JSON"),
        ("{}", "must be one of"),
        ('{"": "disk"}', "offload folder"),
        ('{"": -1}', "GPU index"),
        ('{"": true}', "GPU index"),
    ]:
        with pytest.raises(ValueError, match=match):
            parse_device_map(text)
    check_map_devices({"": 1, "lm_head": 3}, [1, 3])
    with pytest.raises(ValueError, match=r"outside this rank's GPUs \[0, 2\]"):
        check_map_devices({"": 1}, [0, 2])
    with pytest.raises(ValueError, match="runs on the CPU"):
        check_map_devices({"": 0}, None)


def test_maps_replace_cannot_train_with_are_refused_before_any_weights(tiny_checkpoints, tmp_path, monkeypatch):
    model = tiny_checkpoints["llama"]
    with pytest.raises(ValueError, match="cannot be combined with --deepspeed"):
        check_replace_placement(model, "cpu", "auto", tmp_path / "ds.json")
    with pytest.raises(ValueError, match="input embedding"):
        check_replace_placement(model, "cpu", '{"model.layers": "cpu", "model.norm": "cpu", "lm_head": "cpu"}')
    check_replace_placement(model, "cpu", FINE_MAP)
    check_replace_placement(model, "cpu", "none", tmp_path / "ds.json")
    # A GPU machine's mixed map (GPUs and cpu): refused as the offload it would be.
    monkeypatch.setattr(
        "dihal_fast.replace.placement.placement", lambda device, text: {"device_map": parse_device_map(text)}
    )
    with pytest.raises(ValueError, match="offload the cpu part"):
        check_replace_placement(model, "cpu", '{"model": 0, "lm_head": "cpu"}')


def test_a_teacher_accelerate_offloaded_is_refused(tiny_checkpoints):
    backbone, _ = load_causal_lm(tiny_checkpoints["llama"])
    check_teacher_placed(backbone)
    backbone.lm_head.weight = torch.nn.Parameter(torch.empty_like(backbone.lm_head.weight, device="meta"))
    with pytest.raises(ValueError, match="does not fit on this process's GPUs"):
        check_teacher_placed(backbone)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--device-map", "auto", "--deepspeed", "DS"], WITH_DEEPSPEED[:40]),
        (["--device-map", '{"model.layers": "cpu", "lm_head": "cpu"}'], "the input embedding"),
        (["--device-map", '{"": 0}'], "runs on the CPU"),
        (["--device-map", '{"": "disk"}'], "offload folder"),
        (["--device-map", "{oops"], "not valid JSON"),
    ],
)
def test_the_cli_refuses_in_one_line_before_the_run_directory(tiny_checkpoints, tmp_path, capsys, flags, message):
    from dihal_fast.cli import main

    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    flags = [str(ds) if flag == "DS" else flag for flag in flags]
    argv = ["replace", "--model", str(tiny_checkpoints["llama"]), "--layer", "2"]
    assert main([*argv, "--out", str(tmp_path / "run"), "--device", "cpu", *flags]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and message in errors[0], errors
    assert not (tmp_path / "run").exists()
