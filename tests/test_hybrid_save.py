"""``HybridLM.save_pretrained`` as transformers' own: into an existing folder without deleting what is not
ours (a user's files, a Trainer's checkpoints, a tokenizer saved there first), only our own stale weight files
replaced; the directory names the dihal_fast that wrote it, and a load under another release series says so."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from transformers import AutoTokenizer

from dihal_fast import __version__
from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.hybrid import HybridLM
from dihal_fast.hybrid.config import release_series

IDS = torch.tensor([[1, 40, 50, 60, 70]])


@pytest.fixture(scope="module")
def hybrid(tiny_checkpoints) -> HybridLM:
    model, tokenizer = load_causal_lm(tiny_checkpoints["llama"])
    torch.manual_seed(0)
    hybrid = HybridLM.from_backbone(model, 2, {"width": 32, "heads": 2}, tokenizer, tiny_checkpoints["llama"])
    torch.nn.init.normal_(hybrid.bridge.out.weight, std=0.3)
    return hybrid.eval()


def _same_logits(directory, hybrid: HybridLM) -> bool:
    loaded = HybridLM.from_pretrained(directory)
    with torch.no_grad():
        return torch.equal(loaded(IDS).logits, hybrid(IDS).logits)


def test_a_folder_keeps_the_files_that_are_not_ours(hybrid, tmp_path):
    folder = tmp_path / "d"
    (folder / "checkpoint-2").mkdir(parents=True)
    (folder / "NOTES").write_text("mine")
    (folder / "checkpoint-2" / "optimizer.pt").write_bytes(b"state")
    hybrid.save_pretrained(folder)
    assert (folder / "NOTES").read_text() == "mine"
    assert (folder / "checkpoint-2" / "optimizer.pt").read_bytes() == b"state"
    assert _same_logits(folder, hybrid)
    hybrid.save_pretrained(folder)  # a second save over the first: the same files, the user's still there
    assert (folder / "NOTES").read_text() == "mine" and _same_logits(folder, hybrid)
    assert not [path.name for path in folder.iterdir() if path.name.startswith(".")]  # no temporaries left


def test_a_tokenizer_saved_first_stays_when_the_model_has_none(hybrid, tiny_checkpoints, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoints["llama"])
    folder = tmp_path / "d"
    tokenizer.save_pretrained(folder)
    own, hybrid.tokenizer = hybrid.tokenizer, None
    try:
        hybrid.save_pretrained(folder)
    finally:
        hybrid.tokenizer = own
    reloaded = AutoTokenizer.from_pretrained(folder)
    assert reloaded("a text").input_ids == tokenizer("a text").input_ids
    assert HybridLM.from_pretrained(folder).tokenizer is not None


def test_our_stale_weight_shards_are_removed_and_nothing_else(hybrid, tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        (folder / name).write_bytes(b"old shard")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    (folder / "model-notes.txt").write_text("mine")
    hybrid.save_pretrained(folder)
    names = sorted(path.name for path in folder.iterdir())
    assert not [name for name in names if name.startswith("model-0") or name.endswith(".index.json")]
    assert "model.safetensors" in names and "model-notes.txt" in names
    assert _same_logits(folder, hybrid)


def test_the_directory_names_the_package_version_that_wrote_it(hybrid, tmp_path):
    folder = hybrid.save_pretrained(tmp_path / "d")
    assert json.loads((folder / "config.json").read_text())["package_version"] == __version__
    assert f'WRITTEN_BY = "{__version__}"' in (folder / "dihal_hybrid.py").read_text()


@pytest.mark.parametrize(("written_by", "warned"), [("99.0.0", True), (__version__, False), ("", False)])
def test_another_release_series_says_so_in_one_line(hybrid, tmp_path, caplog, written_by, warned):
    folder = hybrid.save_pretrained(tmp_path / "d")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "package_version": written_by}))
    with caplog.at_level(logging.WARNING, logger="dihal_fast.hybrid.config"):
        HybridLM.from_pretrained(folder)
    lines = [record.getMessage() for record in caplog.records if record.name == "dihal_fast.hybrid.config"]
    if warned:
        assert len(set(lines)) == 1 and "written by dihal_fast 99.0.0" in lines[0] and __version__ in lines[0]
        assert "\n" not in lines[0]
    else:
        assert lines == []


def test_release_series():
    assert release_series("0.3.1") == "0.3" and release_series("1.4.2") == "1" and release_series("0.4.0") == "0.4"


def test_another_directory_format_is_refused_in_one_line(hybrid, tmp_path):
    folder = hybrid.save_pretrained(tmp_path / "d")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "format": "dihal_fast.hybrid/3"}))
    with pytest.raises(ValueError, match=r"^not a dihal_fast.hybrid/2 config \(format = 'dihal_fast.hybrid/3'\)$"):
        HybridLM.from_pretrained(folder)
