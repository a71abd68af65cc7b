"""Tests of the shipped backbones by name (``--model tiny-qwen3-16l``), ``dihal backbone list`` and the
Qwen3-family backbone: its construction, training with a reused tokenizer, and the shipped checkpoint."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from dihal_fast.backbone.config import BackboneModelConfig, BackboneTrainConfig
from dihal_fast.backbone.model import build_model
from dihal_fast.cli import main
from dihal_fast.common.assets import DEFAULT_BACKBONE, SHIPPED_BACKBONES, default_model_dir, model_location
from dihal_fast.common.hf_loading import load_tokenizer, resolve_model_dir

QWEN3 = SHIPPED_BACKBONES["tiny-qwen3-16l"]
QWEN3_SHIPPED = (QWEN3.directory / "model.safetensors").is_file()
needs_qwen3 = pytest.mark.skipif(not QWEN3_SHIPPED, reason=f"the tiny-qwen3-16l files are not in {QWEN3.directory} yet")


# --- name resolution ------------------------------------------------------------------------------


def test_none_and_the_default_name_are_the_first_backbone():
    assert DEFAULT_BACKBONE == "tiny-llama-8l"
    assert resolve_model_dir(None) == default_model_dir() == resolve_model_dir("tiny-llama-8l")
    assert (default_model_dir() / "config.json").is_file()


def test_a_path_selects_a_local_checkpoint_even_when_named_like_a_shipped_one(tmp_path, monkeypatch):
    local = tmp_path / "tiny-llama-8l"
    local.mkdir()
    (local / "config.json").write_text(json.dumps({"model_type": "llama"}))
    monkeypatch.chdir(tmp_path)
    assert resolve_model_dir("tiny-llama-8l") == Path("tiny-llama-8l")  # the existing directory wins
    assert resolve_model_dir(str(local)) == local
    monkeypatch.chdir(local)
    assert resolve_model_dir("tiny-llama-8l") == default_model_dir()  # no such directory here: the shipped one


def test_unknown_name_is_one_line_listing_the_shipped_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        resolve_model_dir("tiny-gpt-99l")
    message = str(info.value)
    assert "\n" not in message and "tiny-gpt-99l" in message
    assert all(name in message for name in SHIPPED_BACKBONES)
    with pytest.raises(FileNotFoundError, match="tiny-llama-8l, tiny-qwen3-16l"):
        load_tokenizer("tiny-gpt-99l")


def test_every_command_takes_a_shipped_name(tmp_path, capsys):
    """The commands' ``--model`` reaches resolve_model_dir: a name runs, an unknown one is refused before any work."""
    from dihal_fast.evaluate.loaded_lm import load_lm

    lm = load_lm("tiny-llama-8l")
    assert lm.kind == "backbone" and lm.path == default_model_dir()
    capsys.readouterr()  # the weight-loading bar of load_lm
    for command in (
        ["locate", "--max-tokens", "1000"],
        ["replace", "--layer", "1", "--steps", "1"],
        ["sweep", "--budget-steps", "1"],
        ["demo"],
        ["generate", "--prompt", "x"],
    ):
        code = main([*command, "--model", "tiny-gpt-99l", "--out", str(tmp_path / command[0])])
        err = capsys.readouterr().err
        assert code == 2 and "tiny-qwen3-16l" in err and len(err.strip().splitlines()) == 1, (command, err)
    assert main(["backbone", "info", "--model", "tiny-gpt-99l"]) == 2
    assert "tiny-qwen3-16l" in capsys.readouterr().err


def test_generate_runs_on_a_shipped_name(tmp_path, capsys):
    out = tmp_path / "samples.json"
    assert (
        main(
            [
                "generate",
                "--model",
                "tiny-llama-8l",
                "--prompt",
                "Once upon a time",
                "--max-new-tokens",
                "4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert json.loads(out.read_text())["model"] == str(default_model_dir())


# --- dihal backbone list --------------------------------------------------------------------------


def test_backbone_list_json_shape(capsys):
    assert main(["backbone", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list) and [row["name"] for row in rows] == list(SHIPPED_BACKBONES)
    for row in rows:
        assert {"name", "family", "layers", "hidden_size", "parameters", "heldout_ppl"} <= row.keys()
    first = rows[0]
    assert first["family"] == "llama" and first["layers"] == 8 and first["hidden_size"] == 128
    splits = first["heldout_ppl_by_split"]
    assert min(splits.values()) <= first["heldout_ppl"] <= max(splits.values())
    assert rows[1]["family"] == "qwen3"
    if QWEN3_SHIPPED:
        assert rows[1]["available"] and rows[1]["layers"] >= 16


def test_backbone_list_table(capsys):
    assert main(["backbone", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in SHIPPED_BACKBONES) and "2,107,520" in out


# --- the Qwen3 family -----------------------------------------------------------------------------


def test_qwen3_family_builds_qk_norm_grouped_query_untied(tmp_path):
    tokenizer = load_tokenizer(None)
    cfg = BackboneModelConfig(
        family="qwen3",
        vocab_size=4096,
        hidden_size=48,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=64,
        seq_len=32,
        tie_embeddings=False,
    )
    cfg.validate()
    model = build_model(cfg, tokenizer)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.out_features == 64 and attn.k_proj.out_features == 32 and hasattr(attn, "q_norm")
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert model.config.max_position_embeddings == 32


def test_llama_family_default_is_unchanged():
    """A config without the new fields (as the first backbone's train_config.json) is still the Llama it was."""
    shipped = json.loads((default_model_dir() / "train_config.json").read_text())
    cfg = BackboneTrainConfig.from_dict(shipped)
    assert cfg.model.family == "llama" and cfg.model.kv_heads == cfg.model.num_heads and not cfg.tokenizer
    model = build_model(cfg.model, load_tokenizer(None))
    shipped_config = json.loads((default_model_dir() / "config.json").read_text())
    for key in ("num_key_value_heads", "head_dim", "hidden_size", "tie_word_embeddings", "rope_parameters"):
        assert getattr(model.config, key) == shipped_config[key], key


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"family": "gpt"}, "family must be one of llama, qwen3"),
        ({"num_heads": 4, "num_kv_heads": 3}, "do not split into groups"),
        ({"hidden_size": 30, "num_heads": 4}, "pass --head-dim"),
        ({"head_dim": 7}, "must be even"),
    ],
)
def test_bad_shapes_are_refused(overrides, message):
    base = {
        "family": "qwen3",
        "hidden_size": 32,
        "num_layers": 2,
        "num_heads": 2,
        "intermediate_size": 64,
        "seq_len": 16,
    }
    with pytest.raises(ValueError, match=message):
        BackboneModelConfig(**{**base, **overrides}).validate()


def test_qwen3_trains_with_a_reused_tokenizer(tmp_path):
    from dihal_fast.backbone.train import train_backbone

    text = default_model_dir().parent / "corpus" / "default.txt"
    train, valid = tmp_path / "toy.train.txt", tmp_path / "toy.valid.txt"
    body = text.read_text()[:60_000]
    train.write_text(body[:50_000])
    valid.write_text(body[50_000:])
    model = BackboneModelConfig(
        family="qwen3",
        vocab_size=4096,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        intermediate_size=64,
        seq_len=32,
        tie_embeddings=False,
    )
    cfg = BackboneTrainConfig(
        corpus=[str(train)],
        valid=[str(valid)],
        model=model,
        steps=6,
        batch_size=4,
        lr=1e-2,
        warmup_steps=2,
        eval_every=3,
        eval_windows=2,
        checkpoint_every=3,
        precision="fp32",
        tokenizer=str(default_model_dir()),
    )
    report = train_backbone(cfg, tmp_path / "run", progress=False)
    assert report["architecture"] == "Qwen3ForCausalLM" and report["steps_completed"] == 6
    assert load_tokenizer(tmp_path / "run").get_vocab() == load_tokenizer(None).get_vocab()
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        BackboneTrainConfig(corpus=[str(train)], tokenizer=str(tmp_path / "none")).validate()


# --- the shipped Qwen3 backbone -------------------------------------------------------------------


@needs_qwen3
def test_shipped_qwen3_loads_offline_and_beats_bigram(monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dihal_fast.backbone.perplexity import stream_nll
    from dihal_fast.backbone.tokenizer import encode_documents
    from dihal_fast.common import read_json

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = model_location("tiny-qwen3-16l")
    assert (path / "model.safetensors").stat().st_size <= 11 * 10**6
    model = AutoModelForCausalLM.from_pretrained(str(path))
    tok = AutoTokenizer.from_pretrained(str(path))
    config = model.config
    assert config.model_type == "qwen3" and config.num_hidden_layers >= 16 and not config.tie_word_embeddings
    assert config.num_key_value_heads < config.num_attention_heads
    assert tok.get_vocab() == load_tokenizer(None).get_vocab()  # the first backbone's tokenizer, reused
    report = read_json(path / "training_report.json")
    assert report["checkpoint_bytes"] == (path / "model.safetensors").stat().st_size  # the report is of these weights
    for name, row in report["validation"].items():  # every held-out split below both baselines
        assert row["ppl"] < min(row["bigram_ppl"], row["unigram_ppl"] / 4), name
    text = (default_model_dir().parent / "corpus" / "default.txt").read_text()[:6000]
    nll, count = stream_nll(model.float(), encode_documents(tok, [text]), seq_len=256)
    assert math.exp(nll / count) < report["validation"]["gutenberg_nltk"]["unigram_ppl"] / 4
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 5, 9]])).logits).all()
