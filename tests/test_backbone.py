"""Tests of the embedded backbone: tokenizer, baselines, data order, training/resume, bad input, shipped assets."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dihal_fast.backbone import default_corpus, default_model_dir
from dihal_fast.backbone.baselines import best_bigram_perplexity, bigram_perplexity, unigram_perplexity
from dihal_fast.backbone.config import BackboneModelConfig, BackboneTrainConfig
from dihal_fast.backbone.corpus import read_text_file, split_tail
from dihal_fast.backbone.data import WindowSampler
from dihal_fast.backbone.perplexity import stream_nll
from dihal_fast.backbone.tokenizer import encode_documents, train_tokenizer
from dihal_fast.backbone.train import train_backbone
from dihal_fast.cli import main
from dihal_fast.train.checkpoint import latest_checkpoint
from dihal_fast.train.settings import lr_factor

WORDS = "the a little big red dog cat girl boy saw ran to park home and then was happy sad with her his".split()


def english_like(seed: int, n_sentences: int) -> str:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_sentences):
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9)))
        lines.append(sentence.capitalize() + ".")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def tiny_texts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("texts")
    files = {"train": root / "toy.train.txt", "valid": root / "toy.valid.txt"}
    files["train"].write_text(english_like(0, 400))
    files["valid"].write_text(english_like(1, 40))
    return files


def tiny_config(files: dict[str, Path], steps: int = 20, **overrides) -> BackboneTrainConfig:
    model = BackboneModelConfig(
        vocab_size=320, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seq_len=32
    )
    base = dict(
        corpus=[str(files["train"])],
        valid=[str(files["valid"])],
        model=model,
        steps=steps,
        batch_size=4,
        lr=1e-2,
        warmup_steps=3,
        eval_every=5,
        eval_windows=4,
        checkpoint_every=5,
        precision="fp32",
    )
    base.update(overrides)
    return BackboneTrainConfig(**base)


# --- tokenizer ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([english_like(0, 200)], vocab_size=300)


@given(st.text(max_size=200))
def test_tokenizer_round_trip_any_unicode(tokenizer, text):
    ids = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids) == text


def test_tokenizer_saves_and_loads_with_auto(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    assert (loaded.bos_token, loaded.eos_token, loaded.pad_token) == ("<s>", "</s>", "<pad>")
    assert loaded("the red dog")["input_ids"] == tokenizer("the red dog")["input_ids"]
    stream = encode_documents(tokenizer, ["a dog", "the cat"])
    assert stream[0] == tokenizer.bos_token_id and stream[-1] == tokenizer.eos_token_id
    assert (stream == tokenizer.eos_token_id).sum() == 2


# --- baselines ------------------------------------------------------------------------------------


def test_baselines_against_hand_computed_values():
    train, ev = np.array([0, 1, 0, 1, 2]), np.array([0, 1, 2])
    # unigram add-1: counts (2, 2, 1), N = 5, V = 3 -> p(1) = 3/8, p(2) = 2/8 on targets [1, 2]
    assert unigram_perplexity(train, ev, 3) == pytest.approx(1 / math.sqrt(3 / 8 * 2 / 8))
    # bigram k=0.5: c(0,1)=2, c(1,2)=1, c(0)=c(1)=2 -> p(1|0)=2.5/3.5, p(2|1)=1.5/3.5
    assert bigram_perplexity(train, ev, 3, 0.5) == pytest.approx(1 / math.sqrt(2.5 / 3.5 * 1.5 / 3.5))


@given(
    st.lists(st.integers(0, 5), min_size=2, max_size=60),
    st.lists(st.integers(0, 5), min_size=2, max_size=30),
    st.sampled_from([1e-3, 0.1, 1.0]),
)
def test_bigram_matches_dictionary_reference(train, ev, k):
    pairs, contexts = Counter(zip(train[:-1], train[1:])), Counter(train[:-1])
    logp = [math.log((pairs[(v, w)] + k) / (contexts[v] + 6 * k)) for v, w in zip(ev[:-1], ev[1:])]
    assert bigram_perplexity(np.array(train), np.array(ev), 6, k) == pytest.approx(math.exp(-np.mean(logp)), rel=1e-9)


def test_best_bigram_picks_lowest_and_bad_ids_are_refused():
    rng = np.random.default_rng(0)
    train, ev = rng.integers(0, 8, 500), rng.integers(0, 8, 100)
    ppl, k = best_bigram_perplexity(train, ev, 8, grid=(0.01, 1.0))
    assert ppl == min(bigram_perplexity(train, ev, 8, 0.01), bigram_perplexity(train, ev, 8, 1.0))
    assert ppl == bigram_perplexity(train, ev, 8, k)
    with pytest.raises(ValueError, match="token ids must lie"):
        unigram_perplexity(train, np.array([0, 9]), 8)


# --- data order, schedule, evaluation ---------------------------------------------------------------


def test_window_sampler_is_a_function_of_the_step():
    stream = np.arange(1000, dtype=np.int32)
    a, b = WindowSampler(stream, 16, 4, seed=3), WindowSampler(stream, 16, 4, seed=3)
    for step in (0, 7, 100, 13):
        batch = a.batch(step)
        assert torch.equal(batch, b.batch(step))
        assert batch.shape == (4, 17) and torch.all(batch[:, 1:] - batch[:, :-1] == 1)  # contiguous windows
    starts = {int(a.batch(s)[j, 0]) for s in range(a.n_windows // 4) for j in range(4)}
    assert len(starts) == 4 * (a.n_windows // 4)  # an epoch visits distinct windows


def test_lr_schedule_warmup_then_cosine():
    cfg = BackboneTrainConfig(corpus=["x"], steps=110, warmup_steps=10, min_lr_ratio=0.1).loop_settings()
    assert lr_factor(0, cfg) == pytest.approx(0.1) and lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(10, cfg) == pytest.approx(1.0) and lr_factor(60, cfg) == pytest.approx(0.55)
    assert lr_factor(110, cfg) == pytest.approx(0.1)


def test_stream_nll_scores_every_token_once(tokenizer):
    from dihal_fast.backbone.model import build_model

    torch.manual_seed(0)
    model = build_model(
        BackboneModelConfig(
            vocab_size=len(tokenizer), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seq_len=64
        ),
        tokenizer,
    )
    ids = encode_documents(tokenizer, [english_like(5, 20)])[:41]
    assert len(ids) == 41
    total, count = stream_nll(model, ids, seq_len=40)  # one window: the whole stream
    with torch.no_grad():
        full = torch.nn.functional.cross_entropy(
            model(input_ids=torch.tensor(ids[None, :-1], dtype=torch.long)).logits[0],
            torch.tensor(ids[1:], dtype=torch.long),
            reduction="sum",
        )
    assert count == 40 and total == pytest.approx(float(full), rel=1e-5)
    assert stream_nll(model, ids, seq_len=7, batch_size=3)[1] == 40


# --- training, resume, bad input ------------------------------------------------------------------


def test_tiny_training_lowers_the_loss(tiny_texts, tmp_path):
    import json

    report = train_backbone(tiny_config(tiny_texts, steps=30), tmp_path / "run", progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    val = [r["val_loss"]["toy"] for r in records if "val_loss" in r]
    assert val[-1] < val[0] - 1.0
    row = report["validation"]["toy"]
    assert row["ppl"] < row["unigram_ppl"]
    assert (tmp_path / "run" / "training_curve.png").stat().st_size > 1000
    assert report["data"]["files"][0]["sha256"] and report["steps_completed"] == 30
    assert report.out == tmp_path / "run"  # a StageReport of what training_report.json holds
    assert report.to_dict() == json.loads((tmp_path / "run" / "training_report.json").read_text())


def test_resume_equals_uninterrupted(tiny_texts, tmp_path):
    import json

    from safetensors.torch import load_file

    train_backbone(tiny_config(tiny_texts), tmp_path / "full", progress=False)
    train_backbone(tiny_config(tiny_texts), tmp_path / "split", stop_at=10, progress=False)
    assert latest_checkpoint(tmp_path / "split").name == "step_00000010"
    report = train_backbone(tiny_config(tiny_texts), tmp_path / "split", resume=True, progress=False)
    assert report["steps_completed"] == 20
    full, split = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("full", "split"))
    assert full.keys() == split.keys()
    for name in full:
        assert torch.equal(full[name], split[name]), name
    timing = ("tokens_per_s", "elapsed_s")
    logs = [
        [
            {k: v for k, v in json.loads(line).items() if k not in timing}
            for line in (tmp_path / d / "log.jsonl").read_text().splitlines()
        ]
        for d in ("full", "split")
    ]
    assert logs[0] == logs[1] and len(logs[0]) == 2 + 4  # train loss at steps 10, 20; validation every 5


def test_resume_may_replan_the_number_of_steps(tiny_texts, tmp_path):
    import json

    out = tmp_path / "run"
    train_backbone(tiny_config(tiny_texts, steps=20), out, stop_at=10, progress=False)
    cached = (out / "tokens.npz").stat().st_mtime_ns
    report = train_backbone(tiny_config(tiny_texts, steps=15), out, resume=True, progress=False)
    assert report["steps_completed"] == report["steps_planned"] == 15
    assert json.loads((out / "train_config.json").read_text())["steps"] == 15
    assert '"event": "steps changed from 20 to 15"' in (out / "log.jsonl").read_text()
    assert (out / "tokens.npz").stat().st_mtime_ns == cached  # the token cache was reused
    lrs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in lrs if "lr" in r][-1] == pytest.approx(1e-2 * 0.1)  # annealed to min at the new end


def test_out_dir_with_a_model_is_not_overwritten(tiny_texts, tmp_path):
    out = tmp_path / "run"
    train_backbone(tiny_config(tiny_texts, steps=5), out, progress=False)
    before = (out / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="already holds a model"):
        train_backbone(tiny_config(tiny_texts, steps=5), out, progress=False)
    with pytest.raises(ValueError, match="holds a different run.*seed"):
        train_backbone(tiny_config(tiny_texts, steps=5, seed=1), out, resume=True, progress=False)
    assert (out / "model.safetensors").read_bytes() == before


def test_bad_corpus_files_are_refused(tmp_path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf" + "é".encode("latin-1") + b" ok\n")
    with pytest.raises(ValueError, match=r"latin1.txt is not valid UTF-8: byte offset 3"):
        read_text_file(bad)
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        read_text_file(empty)
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        read_text_file(tmp_path / "nope.txt")
    code = main(["backbone", "train", "--corpus", str(bad), "--out", str(tmp_path / "o"), "--no-progress"])
    assert code == 2 and "byte offset 3" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_split_tail_cuts_at_a_line_break():
    head, tail = split_tail("line one\nline two\nline three\nline four\n", 0.3)
    assert head + tail == "line one\nline two\nline three\nline four\n" and head.endswith("\n") and tail.strip()


# --- the shipped assets ---------------------------------------------------------------------------


def test_shipped_backbone_loads_offline_and_beats_bigram(monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dihal_fast.common import read_json

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = default_model_dir()
    assert (path / "model.safetensors").stat().st_size <= 32 * 2**20
    model = AutoModelForCausalLM.from_pretrained(str(path))
    tok = AutoTokenizer.from_pretrained(str(path))
    assert model.config.model_type == "llama" and model.config.num_hidden_layers >= 8
    report = read_json(path / "training_report.json")
    text = default_corpus().read_text()[:6000]
    ids = encode_documents(tok, [text])
    nll, count = stream_nll(model.float(), ids, seq_len=256)
    measured = math.exp(nll / count)
    for name, row in report["validation"].items():
        assert row["ppl"] < 0.75 * row["bigram_ppl"], name
    assert measured < report["validation"]["gutenberg_nltk"]["bigram_ppl"]


def test_default_corpus_is_held_out_text(shared_data):
    corpus = default_corpus()
    assert corpus.stat().st_size < 500_000
    text = shared_data / "text"
    expected = (text / "gutenberg_nltk.valid.txt").read_bytes() + b"\n" + (text / "state_union.valid.txt").read_bytes()
    assert corpus.read_bytes() == expected


def test_info_prints_perplexities(capsys):
    assert main(["backbone", "info"]) == 0
    out = capsys.readouterr().out
    assert "LlamaForCausalLM" in out and "parameters:" in out and "gutenberg_nltk" in out
    assert main(["backbone", "info", "--model", "/no/such/dir"]) == 2
    assert "no checkpoint at /no/such/dir" in capsys.readouterr().err


def test_deepspeed_zero1_run_equals_plain_torch(tiny_texts, tmp_path):
    """The backbone trains through the shared loop's DeepSpeed engine too (one process, gloo, ZeRO-1)."""
    import json

    from safetensors.torch import load_file

    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    train_backbone(tiny_config(tiny_texts, steps=3), tmp_path / "plain", progress=False)
    train_backbone(
        tiny_config(tiny_texts, steps=3), tmp_path / "zero", progress=False, deepspeed_config=tmp_path / "ds.json"
    )
    plain, zero = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("plain", "zero"))
    assert plain.keys() == zero.keys()
    for name in plain:
        torch.testing.assert_close(zero[name], plain[name], rtol=1e-5, atol=1e-6)
    assert json.loads((latest_checkpoint(tmp_path / "zero") / "state.json").read_text())["engine"] == "deepspeed"
