"""Special tokens as the model's tokenizer says (BOS-adding, no-BOS and chat-instruct tokenizers), the corpus handed
on intact (files, shares under --max-tokens, --from-locate), and what `dihal evaluate` and `dihal replace` report."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dihal_fast.cli import main
from dihal_fast.common import read_json
from dihal_fast.corpus import corpus_blocks, read_texts, token_convention
from dihal_fast.evaluate.generation import Generation
from dihal_fast.evaluate.harness import EvalProtocolConfig, heldout_blocks, sample_metrics
from dihal_fast.evaluate.loaded_lm import load_lm
from dihal_fast.evaluate.scoring import generative_perplexity
from dihal_fast.testing import make_tiny_checkpoint, make_tiny_tokenizer

DOCUMENTS = [f"Story {i}: once upon a time a fox and a dog went to the river number {i % 7}." for i in range(80)]
SEQ_LEN, EVAL_BLOCKS = 24, 8
DIHAL = str(Path(sys.executable).with_name("dihal"))  # the installed command


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "stories.txt"
    path.write_text("\n\n".join(DOCUMENTS))
    return path


def _saved(tokenizer, tmp_path: Path):
    """``tokenizer`` saved and loaded again, as a user's checkpoint gives it."""
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path / "tokenizer")
    return AutoTokenizer.from_pretrained(tmp_path / "tokenizer")


def _expected_stream(tokenizer, bos: bool) -> list[int]:
    """Every document as a plain transformers call gives it (with or without BOS), then EOS."""
    ids: list[int] = []
    for text in DOCUMENTS:
        ids += tokenizer(text, add_special_tokens=bos)["input_ids"] + [tokenizer.eos_token_id]
    return ids


@pytest.mark.parametrize("convention", ["bos", "chat"])
def test_a_bos_adding_tokenizer_starts_every_document_with_bos(convention, corpus, tmp_path):
    """Gemma / Llama 3 (base: ``bos``, instruct: ``chat``): BOS before each document, EOS after it, no template."""
    tokenizer = _saved(make_tiny_tokenizer(convention=convention), tmp_path)
    assert tokenizer("a")["input_ids"][0] == tokenizer.bos_token_id  # the tokenizer says: BOS
    blocks = corpus_blocks(tokenizer, read_texts(corpus), SEQ_LEN).blocks.flatten().tolist()
    stream = _expected_stream(tokenizer, bos=True)
    assert blocks == stream[: len(blocks)] and blocks.count(tokenizer.bos_token_id) == len(DOCUMENTS)
    turns = set(tokenizer.convert_tokens_to_ids(["<|turn|>", "<|end_turn|>"])) if convention == "chat" else set()
    assert not turns & set(blocks) and None not in turns  # the chat template is never applied to plain text
    documents = token_convention(tokenizer).describe()
    assert documents == "documents as `<s> TEXT </s>`: the BOS the tokenizer adds, EOS after each document; " + (
        "no chat template"
    )
    held = heldout_blocks(tokenizer, corpus, EvalProtocolConfig(seq_len=SEQ_LEN, eval_blocks=EVAL_BLOCKS))
    assert held.blocks.flatten().tolist() == blocks[-EVAL_BLOCKS * SEQ_LEN :]


def test_a_tokenizer_without_bos_keeps_documents_joined_by_eos_and_starts_samples_at_eos(corpus, tmp_path):
    """Qwen / SmolLM2: no BOS token at all. Documents are the text then EOS, as before; a sample or a Gen PPL text
    starts from EOS, the document boundary the model saw, so that its first token is scored too."""
    tokenizer = make_tiny_tokenizer()
    tokenizer.bos_token = None
    tokenizer = _saved(tokenizer, tmp_path)
    assert tokenizer.bos_token_id is None
    blocks = corpus_blocks(tokenizer, read_texts(corpus), SEQ_LEN).blocks.flatten().tolist()
    assert blocks == _expected_stream(tokenizer, bos=False)[: len(blocks)]
    convention = token_convention(tokenizer)
    assert convention.prefix == () and convention.start == (tokenizer.eos_token_id,)
    assert convention.describe().startswith("documents as `TEXT </s>`: no BOS (the tokenizer adds none)")

    class Uniform(torch.nn.Module):
        config = type("Config", (), {"max_position_embeddings": 64})()

        def __init__(self) -> None:
            super().__init__()
            self.unused = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, attention_mask):
            return type("Out", (), {"logits": torch.zeros(*input_ids.shape, len(tokenizer))})()

    texts = ["a fox and a dog", "the river"]
    scored = generative_perplexity(texts, Uniform(), tokenizer, device="cpu")
    assert scored["n_scored_tokens"] == sum(len(tokenizer(t)["input_ids"]) for t in texts)  # no first token lost


def test_samples_drop_special_and_added_tokens(tiny_checkpoints):
    """A sample that starts with an added control token (Gemma's `<start_of_image>`) is text without it."""
    evaluator = load_lm(tiny_checkpoints["llama"])
    tokenizer = make_tiny_tokenizer()
    tokenizer.add_tokens(["<start_of_image>"])  # an added token that is not marked special
    image = tokenizer.convert_tokens_to_ids("<start_of_image>")
    words = tokenizer("a fox and a dog", add_special_tokens=False)["input_ids"]
    rows = torch.tensor([[image, tokenizer.bos_token_id, *words], [*words, tokenizer.eos_token_id, image]])
    _, texts = sample_metrics(Generation(rows, 1.0), tokenizer, evaluator)
    assert texts == ["a fox and a dog", "a fox and a dog"]


def _peaky_bos_checkpoint(root: Path) -> Path:
    """A random tiny Llama whose tokenizer adds BOS, its weights scaled up so that its predictions depend strongly
    on the context (a random model at the usual scale predicts nearly uniformly, whatever BOS does)."""
    from transformers import AutoModelForCausalLM

    path = make_tiny_checkpoint(root / "bos_llama", "llama", convention="bos")
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(5.0)
    model.save_pretrained(path)
    return path


def _plain_transformers_ppl(path: Path, bos: bool) -> float:
    """Held-out PPL by a plain transformers loop: each document as ``tokenizer(text)`` gives it (with BOS, or
    without), EOS after it, cut into blocks, the last :data:`EVAL_BLOCKS` scored (first token of a block unscored)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    ids = _expected_stream(tokenizer, bos)
    n = len(ids) // SEQ_LEN
    blocks = torch.tensor(ids[: n * SEQ_LEN]).view(n, SEQ_LEN)[-EVAL_BLOCKS:]
    with torch.no_grad():
        logits = model(blocks).logits.double()
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), blocks[:, 1:].flatten())
    return math.exp(float(nll))


def test_evaluate_matches_a_plain_transformers_loop_that_adds_bos(corpus, tmp_path, capsys):
    """`dihal evaluate` on a BOS-adding backbone: its backbone PPL is the plain loop's with BOS within 2 % (and the
    loop without BOS is more than 2 % away, so the check tells them apart); the evaluator is the hybrid's own
    backbone; the report names the convention and the tokens each corpus file gave."""
    from dihal_fast.common.hf_loading import load_causal_lm
    from dihal_fast.hybrid.model import HybridLM

    backbone = _peaky_bos_checkpoint(tmp_path)
    model, tokenizer = load_causal_lm(backbone)
    hybrid = HybridLM.from_backbone(model, 2, tokenizer=tokenizer, backbone_dir=backbone)
    hybrid_dir = hybrid.save_pretrained(tmp_path / "hybrid")
    out = tmp_path / "eval"
    argv = ["evaluate", "--hybrid", hybrid_dir, "--backbone", backbone, "--corpus", corpus, "--out", out]
    sizes = ["--seq-len", SEQ_LEN, "--eval-blocks", EVAL_BLOCKS, "--n-samples", "2", "--max-new-tokens", "4"]
    assert main([str(a) for a in argv + sizes]) == 0, capsys.readouterr().err
    report = read_json(out / "evaluate.json")
    with_bos, without = _plain_transformers_ppl(backbone, True), _plain_transformers_ppl(backbone, False)
    assert abs(report["backbone"]["ppl"] / with_bos - 1) < 0.02
    assert abs(without / with_bos - 1) > 0.02
    assert report["evaluator"]["path"] == str(backbone)
    assert report["protocol"]["documents"].startswith("documents as `<s> TEXT </s>`: the BOS the tokenizer adds")
    assert report["corpus"] == [str(corpus)] and report["corpus_tokens"] == {str(corpus): SEQ_LEN * EVAL_BLOCKS}


def test_max_tokens_draws_from_every_file_in_order(tmp_path):
    """Two files under a budget: an equal share of whole blocks from each, the first file's first."""
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("\n\n".join(DOCUMENTS))
    second.write_text("\n\n".join(text.replace("fox", "cat") for text in DOCUMENTS))
    tokenizer = make_tiny_tokenizer()
    read = corpus_blocks(tokenizer, read_texts([first, second]), SEQ_LEN, max_tokens=10 * SEQ_LEN)
    assert read.blocks.shape == (10, SEQ_LEN)
    assert read.tokens_per_file() == {str(first): 5 * SEQ_LEN, str(second): 5 * SEQ_LEN}
    alone = corpus_blocks(tokenizer, read_texts(second), SEQ_LEN, max_tokens=5 * SEQ_LEN).blocks
    assert torch.equal(read.blocks[5:], alone) and read.origins[4] == ((str(first), SEQ_LEN),)
    short = tmp_path / "short.txt"
    short.write_text(DOCUMENTS[0])  # less than a share: the files after it make up the rest
    read = corpus_blocks(tokenizer, read_texts([short, first]), SEQ_LEN, max_tokens=10 * SEQ_LEN)
    tokens = read.tokens_per_file()
    assert read.blocks.shape[0] == 10 and 0 < tokens[str(short)] < 5 * SEQ_LEN
    assert tokens[str(first)] == 10 * SEQ_LEN - tokens[str(short)]


def test_locate_report_names_every_file_and_its_tokens(tiny_checkpoints, tmp_path, capsys):
    files = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for i, path in enumerate(files):
        path.write_text("\n\n".join(f"{path.stem} {text}" for text in DOCUMENTS[i::2]))
    out = tmp_path / "locate"
    sizes = ["--seq-len", SEQ_LEN, "--max-tokens", 16 * SEQ_LEN, "--repeats", "2", "--sample-size", "100"]
    argv = ["locate", "--model", tiny_checkpoints["llama"], "--corpus", *files, "--out", out, "--k", "4", *sizes]
    assert main([str(a) for a in argv]) == 0, capsys.readouterr().err
    report = read_json(out / "locate.json")
    assert report["corpus_tokens"] == {str(path): 8 * SEQ_LEN for path in files}
    assert report["documents"].startswith("documents as `TEXT </s>`")


def test_replace_from_locate_takes_its_corpus_and_says_so(tiny_checkpoints, tmp_path):
    """--from-locate without --corpus trains on locate's corpus (one log line names it; result.json has the tokens
    per file); no DeepSpeed banner without --deepspeed; the target-statistics pass shows progress."""
    corpus = tmp_path / "located.txt"
    corpus.write_text("\n\n".join(DOCUMENTS))
    located = tmp_path / "locate"
    located.mkdir()
    report = {"selected_layer": 1, "model": str(tiny_checkpoints["llama"]), "corpus": [str(corpus)]}
    (located / "locate.json").write_text(json.dumps(report))
    out = tmp_path / "replace"
    sizes = ["--steps", "1", "--seq-len", "16", "--batch-size", "2", "--val-blocks", "2", "--stats-blocks", "2"]
    env = {**os.environ, "DIHAL_PROGRESS": "plain", "DIHAL_NUM_THREADS": "1"}
    run = subprocess.run(
        [DIHAL, "replace", "--from-locate", str(located), "--out", str(out), *sizes],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    assert f"corpus from {located / 'locate.json'}: {corpus}" in run.stderr
    assert "target statistics" in run.stderr
    assert "Setting accelerator" not in run.stderr + run.stdout
    result = read_json(out / "result.json")
    assert list(result["corpus_tokens"]["train"]) == [str(corpus)] and result["corpus_tokens"]["train"][str(corpus)]
