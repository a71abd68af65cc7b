"""The hybrid directory's tokenizer through ``AutoTokenizer`` in a fresh process, first thing and without a prompt.

transformers 5 reads a directory's ``config.json`` before its tokenizer, so a directory with custom code (the
hybrid's ``auto_map``) asks whether to run it unless ``trust_remote_code=True`` is passed or the model type is
registered (``import dihal_fast.hybrid``). Both documented ways must load silently with nothing loaded before.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.hybrid import HybridLM

TEXT = "Once upon a time"


@pytest.fixture(scope="module")
def hybrid_dir(tiny_checkpoints, tmp_path_factory):
    model, tokenizer = load_causal_lm(tiny_checkpoints["llama"])
    hybrid = HybridLM.from_backbone(model, 2, {"width": 32, "heads": 2}, tokenizer, tiny_checkpoints["llama"])
    return hybrid.save_pretrained(tmp_path_factory.mktemp("hybrid") / "hybrid"), tokenizer(TEXT).input_ids


@pytest.mark.parametrize(
    "load",
    [
        "AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)",
        "__import__('dihal_fast.hybrid') and AutoTokenizer.from_pretrained(sys.argv[1])",
    ],
    ids=["trust_remote_code", "import_dihal_fast"],
)
def test_autotokenizer_loads_the_hybrid_tokenizer_first_in_a_fresh_process_without_a_prompt(hybrid_dir, tmp_path, load):
    directory, expected = hybrid_dir
    script = textwrap.dedent(f"""
        import json, sys
        from transformers import AutoTokenizer
        tok = {load}
        print(json.dumps(tok({TEXT!r}).input_ids))
    """)
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    done = subprocess.run(
        [sys.executable, "-c", script, str(directory)],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "custom code" not in done.stdout + done.stderr  # transformers' question, or its refusal
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected
