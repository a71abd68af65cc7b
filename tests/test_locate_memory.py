"""Memory and disk of ``dihal locate`` as they are: the logged peak is within 1.25x of the measured peak RSS, the
collection checkpoint goes when the run completes (``--keep-checkpoints`` keeps it), and ``--layers`` (the sweep's
candidates) collects, checkpoints and writes only those hidden states, from a forward pass that stops at the deepest."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dihal_fast.collect import LayerStatistics, model_hidden_states, token_keys
from dihal_fast.common.assets import default_model_dir
from dihal_fast.pipeline import LocateConfig, locate

DIHAL = str(Path(sys.executable).with_name("dihal"))
# Runs argv[1:] and prints its peak RSS in kB: the only child of a fresh process, so no other process counts.
PEAK_RSS = (
    "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
    "sys.stderr.write(done.stderr); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
    "sys.exit(done.returncode)"
)
SMALL = {"max_tokens": 16 * 30, "seq_len": 16, "batch_size": 3, "repeats": 2, "sample_size": 60, "k": 8, "n_pairs": 200}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    lines = [
        json.dumps({"text": f"Document {i}: the quick brown fox jumps over the lazy dog {i * 37} times."})
        for i in range(120)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _estimate_and_peak(model: Path, out: Path, *flags: str) -> tuple[float, float]:
    """The peak memory ``dihal locate`` logs and the peak RSS it reached, in MB."""
    argv = [sys.executable, "-c", PEAK_RSS, DIHAL, "locate", "--model", str(model), "--out", str(out), *flags]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=1800, env={**os.environ, "DIHAL_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stderr[-2000:]
    logged = re.search(r"up to (\d+) MB of memory at the peak", done.stderr)
    assert logged, done.stderr[-2000:]
    return float(logged.group(1)), int(done.stdout.split()[-1]) / 1024


@pytest.mark.parametrize("layers", [[], ["--layers", "1", "3"]])
def test_the_logged_peak_memory_is_within_a_quarter_of_the_measured_one(tmp_path, layers):
    estimate, peak = _estimate_and_peak(
        default_model_dir(),
        tmp_path / "run",
        *layers,
        "--max-tokens",
        "16384",
        "--repeats",
        "2",
        "--sample-size",
        "1000",
        "--reservoir-size",
        "12000",
    )
    assert peak / 1.25 <= estimate <= peak * 1.25, (estimate, peak)


def _smollm2_shaped(path: Path) -> None:
    """A random SmolLM2-135M-shaped Llama (width 576, 30 layers, 0.5 GB)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9}
    config = LlamaConfig(**shape, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(path)


def _gemma3_270m_shaped(path: Path) -> None:
    """A random Gemma-3-270M-shaped model (width 640, 18 layers, a 262,144-token vocabulary: 1.1 GB)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    shape = {"hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4}
    config = Gemma3TextConfig(**shape, num_key_value_heads=1, head_dim=256, vocab_size=262144, sliding_window=512)
    Gemma3ForCausalLM(config).save_pretrained(path)


@pytest.mark.slow  # the two real models' shapes, random weights: about 2 CPU-minutes each
@pytest.mark.parametrize("build", [_smollm2_shaped, _gemma3_270m_shaped], ids=["smollm2_135m", "gemma3_270m"])
def test_the_logged_peak_memory_is_within_a_quarter_of_the_measured_one_at_a_real_shape(tmp_path, build):
    from transformers import AutoTokenizer

    model = tmp_path / "model"
    torch.manual_seed(0)
    build(model)
    AutoTokenizer.from_pretrained(default_model_dir()).save_pretrained(model)
    estimate, peak = _estimate_and_peak(
        model,
        tmp_path / "run",
        "--max-tokens",
        "16384",
        "--repeats",
        "2",
        "--sample-size",
        "2000",
        "--reservoir-size",
        "8000",
    )
    assert peak / 1.25 <= estimate <= peak * 1.25, (estimate, peak)


def _locate(model: Path, corpus: Path, out: Path, **fields) -> dict:
    locate(LocateConfig(model=str(model), corpus=[str(corpus)], **{**SMALL, **fields}), out)
    return json.loads((out / "locate.json").read_text())


def test_the_collection_checkpoint_is_removed_when_locate_completes_unless_kept(tiny_checkpoints, corpus, tmp_path):
    model = tiny_checkpoints["llama"]
    first = _locate(model, corpus, tmp_path / "removed")
    assert sorted(p.name for p in (tmp_path / "removed" / "collect").iterdir()) == ["config.json"]
    kept = _locate(model, corpus, tmp_path / "kept", keep_checkpoints=True)
    assert (tmp_path / "kept" / "collect" / "state-rank0000-of-0001.json").is_file()
    assert kept["per_repeat"] == first["per_repeat"]
    # a --resume of the removed run collects again, to the same numbers
    again = _locate(model, corpus, tmp_path / "removed", resume=True)
    assert again["per_repeat"] == first["per_repeat"]


def test_locate_with_layers_collects_and_writes_only_those(tiny_checkpoints, corpus, tmp_path):
    from dihal_fast.pipeline.sweep_stage import SweepBudgetConfig, SweepConfig

    model = tiny_checkpoints["llama"]
    every = _locate(model, corpus, tmp_path / "every")
    budget = SweepBudgetConfig(max_tokens=SMALL["max_tokens"], score_repeats=2, score_sample=60, seq_len=16)
    sweep = SweepConfig(model=str(model), corpus=[str(corpus)], layers=[2, 1], settings=budget).locate_config()
    config = dataclasses.replace(sweep, batch_size=3, k=8, n_pairs=200, keep_checkpoints=True, save_shards=True)
    out = tmp_path / "two"
    locate(config, out)
    two = json.loads((out / "locate.json").read_text())
    assert json.loads((out / "collect" / "config.json").read_text())["layers"] == [1, 2]
    parts = sorted(p.name for p in next((out / "collect").glob("*.parts-*")).iterdir())
    assert parts == sorted(
        [
            "cov-1.safetensors",
            "cov-2.safetensors",
            "reservoir.safetensors",
            "reservoir-1.safetensors",
            "reservoir-2.safetensors",
        ]
    )
    assert sorted(p.name for p in (out / "shards").glob("layer_*")) == [
        "layer_001.safetensors",
        "layer_002.safetensors",
    ]
    assert [row["layer"] for row in two["stream"]] == [1, 2] and len(every["stream"]) == 5
    for name in ("m_curv", "m_mono", "k_eff"):  # the same tokens and hidden states as a collection of every state
        assert np.array(two["per_repeat"][name]).tolist() == np.array(every["per_repeat"][name])[:, :2].tolist()


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2"])
def test_the_hidden_states_of_a_stopped_pass_are_those_of_the_whole_pass(tiny_checkpoints, family):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoints[family]).eval()
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    ones = torch.ones_like(ids)
    whole = model_hidden_states(model.base_model, ids, ones)
    stopped = model_hidden_states(model.base_model, ids, ones, [1, 2])
    assert sorted(stopped) == [1, 2] and all(torch.equal(stopped[l], whole[l]) for l in (1, 2))
    assert len(model_hidden_states(model.base_model, ids, ones, [1, 4])) == 5  # the final normed output: a whole pass


def test_a_resume_reads_each_tensor_once_and_sorting_copies_no_reservoir():
    stats = LayerStatistics([0, 1], 4, 20, seed=3)
    hidden = [torch.randn(2, 8, 4), torch.randn(2, 8, 4)]
    positions = torch.arange(16).reshape(2, 8)
    stats.update(hidden, torch.ones(2, 8, dtype=torch.bool), positions, positions)
    state, reads = stats.state_dict(), []

    class Counting(dict):
        def __getitem__(self, name):
            reads.append(name)
            return super().__getitem__(name)

    LayerStatistics([0, 1], 4, 20, seed=3).load_state_dict(Counting(state))
    assert sorted(reads) == sorted(state)
    reservoir = stats.reservoir
    before = {l: reservoir.vectors[l] for l in reservoir.layers}
    assert reservoir.sorted() is reservoir and all(reservoir.vectors[l] is before[l] for l in reservoir.layers)
    keys = reservoir.keys[: reservoir.size]
    assert np.all(keys[1:] > keys[:-1]) and np.array_equal(keys, token_keys(reservoir.positions[:16], 3))


def test_a_collection_larger_than_the_machine_is_refused_in_one_line(tiny_checkpoints, corpus, tmp_path):
    with pytest.raises(ValueError, match=r"collecting needs \d+\.\d GiB of memory .* lower --reservoir-size"):
        _locate(tiny_checkpoints["llama"], corpus, tmp_path / "run", reservoir_size=10**11)
