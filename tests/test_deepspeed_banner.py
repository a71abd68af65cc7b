"""The package's own saves (the hybrid, the tiny checkpoints) print no DeepSpeed CPU banner from the Python API,
while importing DeepSpeed on its own does (so the check can fail)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU banner shows on CPU-only machines")

SAVE = """
import sys
from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.hybrid import HybridLM
from dihal_fast.testing import make_tiny_checkpoint
model, tokenizer = load_causal_lm(make_tiny_checkpoint(sys.argv[1] + "/tiny", "llama"))
hybrid = HybridLM.from_backbone(model, 1, {"width": 32, "heads": 2, "time_dim": 16}, tokenizer)
hybrid.save_pretrained(sys.argv[1] + "/hybrid")
print("saved")
"""


def _output(*argv: str) -> str:
    run = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout + run.stderr


def test_the_packages_saves_print_no_deepspeed_banner(tmp_path):
    assert "Setting accelerator to CPU" in _output("-c", "import deepspeed")
    output = _output("-c", SAVE, str(tmp_path))
    assert "saved" in output and "Setting accelerator" not in output
