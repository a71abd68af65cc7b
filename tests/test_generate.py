"""Sampling from causal LMs through ``model.generate`` with the float64 protocol (cache equivalence, seeds, EOS,
bad input), ``dihal generate`` on a hybrid and a backbone, and Gen PPL under an evaluator."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.common.sampling import sample_categorical
from dihal_fast.evaluate.generation import check_generation_request
from dihal_fast.evaluate.loaded_lm import LoadedLM
from dihal_fast.evaluate.scoring import generative_perplexity, logits_fn, teacher_forced


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def tiny_lm(request, tiny_checkpoints):
    torch.set_num_threads(1)
    return load_causal_lm(tiny_checkpoints[request.param])


def _loaded(tiny_lm) -> LoadedLM:
    model, tokenizer = tiny_lm
    return LoadedLM("backbone", model.name_or_path, model, tokenizer, 128)


def test_cached_sampling_equals_full_recompute(tiny_lm):
    model, _ = tiny_lm
    prompt = torch.tensor([[5, 17, 42], [7, 7, 9]])
    got = _loaded(tiny_lm).sample(prompt, 6, temperature=0.9, generator=torch.Generator().manual_seed(11))
    gen, ids = torch.Generator().manual_seed(11), prompt
    with torch.no_grad():
        for _ in range(6):
            token = sample_categorical(model(input_ids=ids).logits[:, -1], 0.9, None, gen)
            ids = torch.cat([ids, token[:, None]], dim=1)
    assert torch.equal(got.tokens, ids[:, 3:])
    assert got.seconds > 0


def test_sampling_is_seeded(tiny_lm):
    lm = _loaded(tiny_lm)
    prompt = torch.tensor([[5, 17]]).expand(4, 2)
    a = lm.sample(prompt, 8, generator=torch.Generator().manual_seed(0)).tokens
    b = lm.sample(prompt, 8, generator=torch.Generator().manual_seed(0)).tokens
    c = lm.sample(prompt, 8, generator=torch.Generator().manual_seed(1)).tokens
    assert torch.equal(a, b) and not torch.equal(a, c)
    nucleus = lm.sample(prompt, 8, top_p=1e-6, generator=torch.Generator().manual_seed(2)).tokens
    assert torch.equal(nucleus, lm.sample(prompt, 8, temperature=0).tokens)  # a tiny nucleus holds the argmax only


def test_sampling_stops_at_eos_when_asked(tiny_lm):
    model, tokenizer = tiny_lm
    lm = _loaded(tiny_lm)
    prompt = torch.tensor([[5, 17]])
    free = lm.sample(prompt, 8, temperature=0).tokens
    tokenizer = type(tokenizer).from_pretrained(model.name_or_path)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(int(free[0, 2]))  # the third token becomes EOS
    stopped = LoadedLM("backbone", lm.path, model, tokenizer, 128).sample(prompt, 8, temperature=0, stop_at_eos=True)
    first = int((free[0] == tokenizer.eos_token_id).nonzero()[0])
    assert torch.equal(stopped.tokens, free[:, : first + 1])


@pytest.mark.parametrize(
    "prompt_len, n, new, match",
    [(3, 0, 5, "n-samples"), (3, 2, 0, "max-new-tokens"), (0, 1, 5, "empty"), (120, 1, 20, "context of 128")],
)
def test_bad_generation_requests(prompt_len, n, new, match):
    with pytest.raises(ValueError, match=match):
        check_generation_request(prompt_len, n, new, 128)


def _manual_nll(model, ids: list[int]) -> tuple[float, int]:
    with torch.no_grad():
        log_probs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), dim=-1)
    return -sum(log_probs[i - 1, ids[i]].item() for i in range(1, len(ids))), len(ids) - 1


def test_generative_perplexity_matches_manual_scoring(tiny_lm):
    model, tokenizer = tiny_lm
    texts = ["The quick brown fox.", "Once upon a time there was a little girl who loved books.", "dog"]
    report = generative_perplexity(texts, model, tokenizer, batch_size=2)
    total, count, per_sample = 0.0, 0, []
    for text in texts:
        ids = [tokenizer.bos_token_id] + tokenizer(text, add_special_tokens=False)["input_ids"]
        nll, n = _manual_nll(model, ids)
        total, count = total + nll, count + n
        per_sample.append(math.exp(nll / n))
    assert report["n_scored_tokens"] == count  # BOS prepended: every sample token is scored
    assert report["gen_ppl"] == pytest.approx(math.exp(total / count), rel=1e-4)
    assert report["gen_ppl_per_sample"] == pytest.approx(sum(per_sample) / 3, rel=1e-4)
    assert report["evaluator_dtype"] == "float32" and "retokenised" in report["protocol"]
    assert report["token_ids"][2] == tokenizer("dog", add_special_tokens=False)["input_ids"]
    low, high = report["gen_ppl_interval"]  # a resample is a token-weighted mean of the samples' NLLs
    assert min(per_sample) * (1 - 1e-5) <= low <= report["gen_ppl"] <= high <= max(per_sample) * (1 + 1e-5)


def test_gen_ppl_interval_is_the_bootstrap_of_the_pooled_nll():
    from dihal_fast.evaluate.scoring import pooled_interval

    rng = np.random.default_rng(1)
    sums, counts = rng.uniform(10, 80, size=7), rng.integers(5, 30, size=7)
    rows = np.random.default_rng(0).integers(0, 7, size=(2000, 7))
    pooled = np.exp(sums[rows].sum(axis=1) / counts[rows].sum(axis=1))
    expected = np.quantile(np.log(pooled), [0.025, 0.975])
    assert pooled_interval(sums.tolist(), counts.tolist()) == pytest.approx(np.exp(expected).tolist(), rel=1e-12)
    assert pooled_interval([3.0, 3.0], [2, 2]) == pytest.approx([math.exp(1.5)] * 2)  # no spread, no width


def test_generative_perplexity_truncates_and_reports_empty(tiny_lm):
    model, tokenizer = tiny_lm
    long_text = "the quick brown fox jumps over the lazy dog " * 60
    report = generative_perplexity([long_text, ""], model, tokenizer)
    assert report["n_truncated"] == 1 and report["n_empty"] == 1
    assert len(report["token_ids"][0]) == report["evaluator_context"] - 1
    with pytest.raises(ValueError, match="empty"):
        generative_perplexity([""], model, tokenizer)


def test_teacher_forced_kl_to_itself_is_zero_and_nll_matches(tiny_lm):
    model, _ = tiny_lm
    blocks = torch.randint(3, 300, (3, 10), generator=torch.Generator().manual_seed(0))
    out = teacher_forced(logits_fn(model), blocks, batch_size=2, reference=logits_fn(model))
    total = sum(_manual_nll(model, row.tolist())[0] for row in blocks)
    assert out["n_tokens"] == 27
    assert out["nll"] == pytest.approx(total / 27, rel=1e-5)
    assert abs(out["kl"]) < 1e-6


@pytest.fixture(scope="module")
def tiny_hybrid_dir(tiny_checkpoints, tmp_path_factory):
    from dihal_fast.hybrid.model import HybridLM

    model, tokenizer = load_causal_lm(tiny_checkpoints["llama"])
    torch.manual_seed(0)
    return HybridLM.from_backbone(
        model, 1, tokenizer=tokenizer, backbone_dir=tiny_checkpoints["llama"]
    ).save_pretrained(tmp_path_factory.mktemp("hybrid") / "run" / "hybrid")


def test_generate_cli_greedy_top_p_and_eos(tiny_hybrid_dir, tmp_path):
    from dihal_fast.cli import main
    from dihal_fast.common import read_json

    base = ["--model", str(tiny_hybrid_dir), "--prompt", "The quick", "--n-samples", "2", "--max-new-tokens", "6"]
    for seed in ("1", "2"):
        assert (
            main(["generate", *base, "--no-do-sample", "--seed", seed, "--out", str(tmp_path / f"g{seed}.json")]) == 0
        )
    greedy = [read_json(tmp_path / f"g{seed}.json") for seed in ("1", "2")]
    assert greedy[0]["samples"] == greedy[1]["samples"] and greedy[0]["temperature"] == 0.0
    assert greedy[0]["samples"][0] == greedy[0]["samples"][1]
    assert main(["generate", *base, "--top-p", "0.9", "--no-stop-at-eos", "--out", str(tmp_path / "p.json")]) == 0
    report = read_json(tmp_path / "p.json")
    assert (
        report["top_p"] == 0.9
        and not report["stop_at_eos"]
        and all(len(s["token_ids"]) == 6 for s in report["samples"])
    )


def test_generate_cli_on_hybrid_run_dir_and_backbone(tiny_hybrid_dir, tiny_checkpoints, tmp_path, capsys):
    from dihal_fast.cli import main
    from dihal_fast.common import read_json

    base = ["--prompt", "The quick", "--prompt", "Once", "--n-samples", "2", "--max-new-tokens", "5", "--seed", "3"]
    # a `dihal replace` run directory (its result.json names the hybrid) is accepted as well as the hybrid directory
    (tiny_hybrid_dir.parent / "result.json").write_text('{"hybrid_dir": "hybrid"}')
    assert (
        main(
            ["generate", "--model", str(tiny_hybrid_dir.parent), *base, "--nfe", "2", "--out", str(tmp_path / "a.json")]
        )
        == 0
    )
    assert (
        main(["generate", "--model", str(tiny_hybrid_dir), *base, "--nfe", "2", "--out", str(tmp_path / "b.json")]) == 0
    )
    a, b = read_json(tmp_path / "a.json"), read_json(tmp_path / "b.json")
    assert a["kind"] == "hybrid" and len(a["samples"]) == 4 and a["samples"] == b["samples"]  # seeded
    assert all(len(s["token_ids"]) == 5 for s in a["samples"]) and a["tokens_per_s"] > 0
    assert main(["generate", "--model", str(tiny_checkpoints["gpt2"]), *base, "--out", str(tmp_path / "c.json")]) == 0
    assert read_json(tmp_path / "c.json")["kind"] == "backbone"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--n-samples", "0"], "n-samples must be >= 1"),
        (["--max-new-tokens", "400"], "exceeds the model's context"),
        (["--prompt", "dog " * 200], "exceeds the model's context"),
    ],
)
def test_generate_cli_bad_input(tiny_hybrid_dir, extra, message, capsys):
    from dihal_fast.cli import main

    assert main(["generate", "--model", str(tiny_hybrid_dir), *extra]) == 2
    assert message in capsys.readouterr().err


def test_generate_cli_bridge_dtype(tiny_hybrid_dir, tiny_checkpoints, tmp_path, capsys):
    from dihal_fast.cli import main
    from dihal_fast.common import read_json

    base = ["--prompt", "The quick", "--n-samples", "1", "--max-new-tokens", "4", "--dtype", "bfloat16"]
    out = tmp_path / "kept.json"
    assert (
        main(["generate", "--model", str(tiny_hybrid_dir), *base, "--bridge-dtype", "float32", "--out", str(out)]) == 0
    )
    assert read_json(out)["bridge_dtype"] == "float32"
    assert main(["generate", "--model", str(tiny_hybrid_dir), *base, "--out", str(out)]) == 0
    assert read_json(out)["bridge_dtype"] == "auto"  # the hybrid's own
    assert main(["generate", "--model", str(tiny_checkpoints["gpt2"]), *base, "--bridge-dtype", "auto"]) == 2
    assert "--bridge-dtype applies to hybrid models only" in capsys.readouterr().err
