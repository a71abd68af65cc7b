"""``dihal locate`` end to end: report + plot + shards, stop/resume, bad input, 2-process torchrun."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from dihal_fast.cli import build_parser, main

SEQ_LEN, BLOCKS = 24, 24
SMALL = [
    "--seq-len",
    str(SEQ_LEN),
    "--batch-size",
    "3",
    "--max-tokens",
    str(SEQ_LEN * BLOCKS),
    "--repeats",
    "2",
    "--sample-size",
    "120",
    "--k",
    "8",
    "--n-pairs",
    "300",
    "--device",
    "cpu",
    "--checkpoint-every",
    "2",
]
UNLIMITED = SMALL[:4] + SMALL[6:]  # the same without --max-tokens: the whole corpus
TOKENS = BLOCKS * (SEQ_LEN - 1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    lines = [
        json.dumps({"text": f"Document {i}: the quick brown fox jumps over the lazy dog, {i * 37} times."})
        for i in range(120)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _locate(capsys, *args) -> tuple[int, str, str]:
    code = main(["locate", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _comparable(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in ("timings", "config")}


def test_locate_writes_report_plot_and_shards(tiny_checkpoints, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, _ = _locate(
        capsys, "--model", tiny_checkpoints["llama"], "--corpus", corpus, "--out", out, "--save-shards", *SMALL
    )
    assert code == 0 and "selected layer" in stdout
    report = json.loads((out / "locate.json").read_text())
    assert report["n_tokens"] == TOKENS and report["n_blocks"] == BLOCKS and report["n_layers"] == 4
    assert [row["layer"] for row in report["layers"]] == report["candidate_layers"] == [1, 2, 3]
    for row in report["layers"]:
        for name in ("m_curv", "m_mono", "k_eff", "score", "log_m_curv", "log_m_mono", "log_k_eff"):
            assert set(row[name]) == {"mean", "std"} and np.isfinite(row[name]["mean"]) and row[name]["std"] >= 0
        assert row["m_curv"]["mean"] > 0 and row["k_eff"]["mean"] >= 1
    means = [row["score"]["mean"] for row in report["layers"]]
    assert report["selected_layer"] == report["candidate_layers"][int(np.argmax(means))]
    assert np.allclose(np.mean(report["per_repeat"]["score"], axis=0), means)
    assert [s["layer"] for s in report["stream"]] == list(range(5))
    assert report["config"]["collect"]["reservoir_size"] == 240 and report["config"]["select"]["sample_size"] == 120
    assert (out / "geometry.png").read_bytes()[:4] == b"\x89PNG"

    meta = json.loads((out / "shards" / "metadata.json").read_text())
    assert meta["files"] == [f"layer_{l:03d}.safetensors" for l in range(5)] and meta["n_tokens"] == 240
    shard = load_file(out / "shards" / "layer_002.safetensors")
    assert shard["vectors"].shape == (240, 32) and shard["positions"].unique().numel() == 240
    assert ((shard["positions"] % SEQ_LEN) != 0).all()  # first positions are excluded
    assert sum((out / "shards" / f).stat().st_size for f in meta["files"]) >= meta["bytes"]


def test_stopped_run_leaves_no_report_and_resume_matches_uninterrupted(tiny_checkpoints, corpus, tmp_path, capsys):
    model = tiny_checkpoints["gpt2"]
    code, _, _ = _locate(capsys, "--model", model, "--corpus", corpus, "--out", tmp_path / "whole", *SMALL)
    assert code == 0
    parts = tmp_path / "parts"
    code, _, _ = _locate(capsys, "--model", model, "--corpus", corpus, "--out", parts, "--max-batches", "3", *SMALL)
    assert code == 3
    assert not (parts / "locate.json").exists() and not (parts / "geometry.png").exists()
    assert (parts / "collect" / "state-rank0000-of-0001.json").is_file()
    code, _, _ = _locate(
        capsys, "--model", model, "--corpus", corpus, "--out", parts, "--resume", "--keep-checkpoints", *SMALL
    )
    assert code == 0
    whole = json.loads((tmp_path / "whole" / "locate.json").read_text())
    resumed = json.loads((parts / "locate.json").read_text())
    assert _comparable(resumed) == _comparable(whole)
    # a finished collection is reused: new selection settings need no second pass over the corpus
    code, _, _ = _locate(
        capsys, "--model", model, "--corpus", corpus, "--out", parts, "--resume", *SMALL, "--repeats", "3"
    )
    assert code == 0
    again = json.loads((parts / "locate.json").read_text())
    assert len(again["per_repeat"]["score"]) == 3 and again["n_tokens"] == whole["n_tokens"]
    assert again["per_repeat"]["score"][:2] == whole["per_repeat"]["score"]


def test_resume_removes_the_temporary_file_of_a_killed_checkpoint_write(tiny_checkpoints, corpus, tmp_path, capsys):
    model, out = tiny_checkpoints["llama"], tmp_path / "run"
    code, _, _ = _locate(capsys, "--model", model, "--corpus", corpus, "--out", out, "--max-batches", "2", *SMALL)
    assert code == 3
    # what a kill -9 during atomic_write_bytes leaves: the hidden temporary beside the checkpoint
    leftovers = [
        out / "collect" / ".state-rank0000-of-0001.json.k1ll3d",
        out / "collect" / ".config.json.k1ll3d",
    ]
    for leftover in leftovers:
        leftover.write_bytes(b"half a checkpoint")
    code, _, _ = _locate(
        capsys, "--model", model, "--corpus", corpus, "--out", out, "--resume", "--max-batches", "1", *SMALL
    )
    assert code == 3
    assert not any(leftover.exists() for leftover in leftovers)
    assert (out / "collect" / "state-rank0000-of-0001.json").is_file()


def _no_pad_checkpoint(source: Path, dest: Path) -> Path:
    from transformers import AutoTokenizer

    shutil.copytree(source, dest)
    tokenizer = AutoTokenizer.from_pretrained(dest)
    tokenizer.pad_token, tokenizer.eos_token = None, None
    tokenizer.save_pretrained(dest)
    return dest


def _broken_weights(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest)
    weights = dest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    return dest


def _broken_config(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest)
    (dest / "config.json").write_text('{"model_type": "llama", ')
    return dest


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing_model", "model directory does not exist"),
        ("broken_weights", "could not load a causal LM|model.safetensors is corrupt"),
        ("broken_config", "config.json (is corrupt|is not valid JSON)"),
        ("no_pad_token", "neither a pad nor an eos token"),
        ("empty_corpus", "contains no text"),
        ("too_few_tokens", r"yields only \d+ tokens"),
        ("sample_over_max_tokens", "--sample-size 5000 exceeds the 552 tokens"),
        ("sample_over_collected", r"--sample-size 200 exceeds the \d+ tokens collected"),
        ("layer_out_of_range", r"--layers \[0, 4\] out of range"),
        ("resume_nothing", "collection config to resume"),
        ("seq_len_too_long", "exceeds the model's max_position_embeddings"),
        ("bad_device", "device 'gpu0' is not a torch device"),
    ],
)
def test_bad_input_is_one_clear_line(tiny_checkpoints, corpus, tmp_path, capsys, case, message):
    model = tiny_checkpoints["llama"]
    args = {"--model": model, "--corpus": corpus, "--out": tmp_path / "run"}
    extra: list[str] = []
    if case == "missing_model":
        args["--model"] = tmp_path / "nowhere"
    elif case == "broken_weights":
        args["--model"] = _broken_weights(model, tmp_path / "m")
    elif case == "broken_config":
        args["--model"] = _broken_config(model, tmp_path / "m")
    elif case == "no_pad_token":
        args["--model"] = _no_pad_checkpoint(model, tmp_path / "m")
    elif case == "empty_corpus":
        args["--corpus"] = tmp_path / "empty.txt"
        args["--corpus"].write_text("\n\n")
    elif case == "too_few_tokens":
        extra = ["--max-tokens", "2400000"]
    elif case == "sample_over_max_tokens":
        extra = ["--sample-size", "5000", "--reservoir-size", "6000"]
    elif case == "sample_over_collected":
        args["--corpus"] = tmp_path / "short.txt"
        args["--corpus"].write_text("A short text about foxes and dogs, repeated a few times. " * 4)
        extra = ["--sample-size", "200"]
    elif case == "layer_out_of_range":
        extra = ["--layers", "0", "4"]
    elif case == "resume_nothing":
        extra = ["--resume"]
    elif case == "seq_len_too_long":
        extra = ["--seq-len", "500", "--max-tokens", "1000"]
    elif case == "bad_device":
        extra = ["--device", "gpu0"]
    sizes = UNLIMITED if case == "sample_over_collected" else SMALL
    code, _, err = _locate(capsys, *[x for pair in args.items() for x in pair], *sizes, *extra)
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("dihal locate: error:")]
    assert len(lines) == 1, err
    assert re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "run" / "locate.json").exists()


def test_every_option_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["locate"]
    for action in sub._actions:
        if action.dest != "help":
            assert action.help, f"--{action.dest} has no help"


@pytest.mark.distributed
def test_two_process_gloo_run_equals_one_process(tiny_checkpoints, corpus, tmp_path, capsys):
    dihal = Path(sys.executable).parent / "dihal"
    if not dihal.is_file():
        pytest.skip(f"the dihal console script is not installed next to {sys.executable}")
    common = ["--model", tiny_checkpoints["qwen3"], "--corpus", corpus, "--save-shards", "--keep-checkpoints", *SMALL]
    code, _, _ = _locate(capsys, *common, "--out", tmp_path / "one")
    assert code == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(dihal),
        "locate",
        *map(str, common),
        "--out",
        str(tmp_path / "two"),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = json.loads((tmp_path / "one" / "locate.json").read_text())
    two = json.loads((tmp_path / "two" / "locate.json").read_text())
    assert two["config"]["world_size"] == 2
    assert (two["n_tokens"], two["n_blocks"], two["selected_layer"]) == (
        one["n_tokens"],
        one["n_blocks"],
        one["selected_layer"],
    )
    for name, values in one["per_repeat"].items():
        np.testing.assert_allclose(two["per_repeat"][name], values, rtol=1e-4, atol=1e-6, err_msg=name)
    for a, b in zip(one["stream"], two["stream"]):  # float32 hidden states of differently composed batches
        assert a["trace"] == pytest.approx(b["trace"], rel=1e-6) and a["k_eff"] == pytest.approx(b["k_eff"], rel=1e-6)
    for layer in range(5):
        s1 = load_file(tmp_path / "one" / "shards" / f"layer_{layer:03d}.safetensors")
        s2 = load_file(tmp_path / "two" / "shards" / f"layer_{layer:03d}.safetensors")
        assert s1["positions"].tolist() == s2["positions"].tolist()  # the same tokens, in the same order
        np.testing.assert_allclose(s2["vectors"].numpy(), s1["vectors"].numpy(), rtol=1e-5, atol=1e-5)
    assert sorted(p.name for p in (tmp_path / "two" / "collect").glob("state-*.json")) == [
        "state-rank0000-of-0002.json",
        "state-rank0001-of-0002.json",
    ]
