"""A ``.gguf`` file as ``--model``: read through transformers' GGUF loader, dequantized in the requested dtype,
checked before any work, pinned by its sha256 in the run, and cut into a hybrid that loads without it."""

from __future__ import annotations

import json
import math
import shutil
import sys

import pytest
import torch

pytest.importorskip("gguf", reason="the gguf package is not installed (pip install 'dihal_fast[gguf]')")

from dihal_fast.common.hf_loading import GGUF_SOURCE, file_sha256, load_causal_lm, resolve_model_dir  # noqa: E402
from dihal_fast.common.rundir import read_marker  # noqa: E402
from dihal_fast.errors import DihalValueError  # noqa: E402
from dihal_fast.testing.cli import error_line, run_cli  # noqa: E402
from dihal_fast.testing.gguf_files import llama_to_gguf  # noqa: E402

TEXT = "Once upon a time, the quick brown fox counted 12345 #$% symbols."
# Largest logit difference against the float32 checkpoint, per storage type (F32 is the same numbers).
TOLERANCE = {"F32": 1e-6, "F16": 5e-3, "Q8_0": 5e-2}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A fresh cache directory per test: GGUF views made by one test are not seen by another."""
    monkeypatch.setenv("DIHAL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from dihal_fast.testing import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "llama", "llama")


@pytest.fixture(scope="module")
def gguf_files(llama, tmp_path_factory):
    """The tiny Llama as GGUF files, one per storage type."""
    root = tmp_path_factory.mktemp("gguf")
    return {kind: llama_to_gguf(llama, root / f"tiny.{kind}.gguf", kind) for kind in TOLERANCE}


def _logits(model, tokenizer) -> torch.Tensor:
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.mark.parametrize("kind", sorted(TOLERANCE))
def test_a_gguf_file_loads_as_the_checkpoint_it_was_written_from(llama, gguf_files, kind):
    reference, reference_tokenizer = load_causal_lm(llama)
    model, tokenizer = load_causal_lm(gguf_files[kind], dtype="auto")
    assert model.dtype == (torch.float16 if kind == "F16" else torch.float32)  # --dtype auto: the file's float type
    assert tokenizer(TEXT)["input_ids"] == reference_tokenizer(TEXT)["input_ids"]
    assert tokenizer.pad_token == reference_tokenizer.pad_token
    assert (_logits(model, tokenizer) - _logits(reference, tokenizer)).abs().max() <= TOLERANCE[kind]
    assert model.hf_quantizer is None and "quantization_config" not in model.config.to_dict()  # a plain model
    assert load_causal_lm(gguf_files[kind], dtype="bfloat16")[0].dtype == torch.bfloat16


def test_the_view_is_made_once_and_names_the_file(gguf_files, cache):
    view = resolve_model_dir(gguf_files["F32"])
    assert view.parent == cache / "gguf" and resolve_model_dir(gguf_files["F32"]) == view
    source = json.loads((view / GGUF_SOURCE).read_text())
    assert source["file"] == str(gguf_files["F32"]) and source["sha256"] == file_sha256(gguf_files["F32"])
    assert resolve_model_dir(view) == view  # the view is itself a checkpoint directory


def _truncated(path, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return cut, "truncated"


def _not_gguf(path, tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    return text, "not a readable GGUF file"


def _encoder_decoder(llama, tmp_path):
    return llama_to_gguf(llama, tmp_path / "t5.gguf", architecture="t5"), "'t5' model, not a causal LM"


def _integers(llama, tmp_path):
    return llama_to_gguf(llama, tmp_path / "ints.gguf", "I32"), "cannot dequantize: blk.0.attn_k.weight (I32)"


@pytest.mark.parametrize("make", [_truncated, _not_gguf, _encoder_decoder, _integers])
@pytest.mark.parametrize("command", [["locate"], ["replace", "--layer", "1"], ["backbone", "info"]])
def test_a_bad_gguf_file_is_refused_in_one_line_before_any_work(llama, gguf_files, make, command, tmp_path, capsys):
    path, reason = make(gguf_files["F32"] if make in (_truncated, _not_gguf) else llama, tmp_path)
    out = [] if command[0] == "backbone" else ["--out", str(tmp_path / "run")]
    assert run_cli([*command, "--model", str(path), *out]) == 2
    line = error_line(capsys)
    assert str(path) in line and reason in line, line
    assert not list((tmp_path / "cache").glob("gguf/*"))  # nothing converted


def test_without_the_gguf_package_the_error_says_what_to_install(gguf_files, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(DihalValueError, match=r"needs the gguf package: pip install 'dihal_fast\[gguf\]'"):
        resolve_model_dir(gguf_files["F32"])


def test_backbone_info_describes_the_file(gguf_files, capsys):
    assert run_cli(["backbone", "info", "--model", str(gguf_files["Q8_0"])]) == 0
    out = capsys.readouterr().out
    assert f"sha256 {file_sha256(gguf_files['Q8_0'])}" in out and "F32 x9, Q8_0 x" in out
    assert "architecture: llama (4 layers, hidden 32" in out


def test_a_run_on_a_gguf_file_pins_it_and_its_hybrid_loads_without_it(
    llama, gguf_files, tmp_path, capsys, short_locate_replace
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import dihal_fast.hybrid  # noqa: F401  (registers the hybrid)

    model = tmp_path / "model.gguf"
    shutil.copy(gguf_files["F32"], model)
    located, replaced = short_locate_replace(model, tmp_path / "run", max_tokens=512, steps=2)
    assert all(math.isfinite(row["score"]["mean"]) for row in located["layers"])
    assert math.isfinite(replaced["bridge_loss"])
    recorded = read_marker(tmp_path / "run" / "replace")["inputs"][""]
    assert recorded["model"] == str(model) and recorded["model_sha256"] == file_sha256(model)

    hybrid_dir = replaced.hybrid_dir
    model.unlink()
    shutil.rmtree(tmp_path / "cache")
    hybrid = AutoModelForCausalLM.from_pretrained(hybrid_dir)
    tokenizer = AutoTokenizer.from_pretrained(hybrid_dir)
    assert "quantization_config" not in json.loads((hybrid_dir / "config.json").read_text())["upper"]
    assert torch.isfinite(_logits(hybrid, tokenizer)).all()

    shutil.copy(gguf_files["Q8_0"], model)  # other bytes at the same path: the run does not resume on them
    argv = ["replace", "--model", str(model), "--layer", str(located.selected_layer), "--resume"]
    assert run_cli([*argv, "--out", str(tmp_path / "run" / "replace")]) == 2
    assert "model_sha256" in error_line(capsys)


def test_a_view_refuses_a_file_that_changed_or_is_gone(gguf_files, tmp_path):
    model = tmp_path / "model.gguf"
    shutil.copy(gguf_files["F32"], model)
    view = resolve_model_dir(model)
    with model.open("ab") as handle:
        handle.write(b"\0" * 32)
    with pytest.raises(DihalValueError, match="changed since .* pass the file itself as --model"):
        load_causal_lm(view)
    model.unlink()
    with pytest.raises(FileNotFoundError, match="which is gone"):
        load_causal_lm(view)
