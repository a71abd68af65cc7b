"""Every file a run writes follows the umask, safetensors included (the library itself writes ``0600``): checkpoint
weights / EMA / random state / streams and an exported hybrid's ``model.safetensors``, under 022, 002 and 077,
each in a fresh process whose umask is set before anything is written."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

UMASKS = (0o022, 0o002, 0o077)
# Argv: run root, tiny checkpoint. For each umask (set before anything is written under it): trains the smallest
# HC-DLM (checkpoints with an EMA) into ROOT/<umask> and exports a hybrid there; one process, imports paid once.
RUN = f"""
import os, sys
from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.hcdlm.trainer import train
from dihal_fast.hybrid import HybridLM
from dihal_fast.testing.tiny import hcdlm_tiny_config
model, tokenizer = load_causal_lm(sys.argv[2], "float32", "cpu")
for umask in {UMASKS}:
    os.umask(umask)
    root = os.path.join(sys.argv[1], oct(umask))
    train(hcdlm_tiny_config(steps=2, ema_decay=0.9), root + "/hcdlm")
    hybrid = HybridLM.from_backbone(model, 1, tokenizer=tokenizer, backbone_dir=sys.argv[2])
    hybrid.save_pretrained(root + "/hybrid")
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_checkpoints) -> Path:
    root = tmp_path_factory.mktemp("umask")
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(root), str(tiny_checkpoints["llama"])],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1", "DIHAL_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return root


@pytest.mark.parametrize("umask", UMASKS)
def test_every_file_of_a_run_follows_the_umask(runs, umask):
    root = runs / oct(umask)
    files = [p for p in root.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {f"{name}.safetensors" for name in ("weights", "ema", "rng_rank0", "stream", "model")} <= names
    modes = {str(p.relative_to(root)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert modes == dict.fromkeys(modes, oct(0o666 & ~umask)), json.dumps(modes, indent=1)
    folders = [p for p in root.rglob("*") if p.is_dir()]
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in folders} == {oct(0o777 & ~umask)}, [str(p) for p in folders]


def test_a_hybrid_saved_by_another_library_gets_the_umask_mode(tmp_path):
    """:func:`~dihal_fast.common.io.write_into` (what transformers' writers fill) gives their 0600 files the mode."""
    from dihal_fast.common.io import write_into

    def write(folder: Path) -> None:
        path = folder / "model.safetensors"
        path.write_bytes(b"x")
        os.chmod(path, 0o600)

    old = os.umask(0o002)
    try:
        write_into(tmp_path / "out", write)
    finally:
        os.umask(old)
    assert oct(stat.S_IMODE((tmp_path / "out" / "model.safetensors").stat().st_mode)) == oct(0o664)
