"""On-policy distillation of the bridge (``--on-policy-every``) and the reverse-KL distillation loss: the hybrid's
own continuations, which steps use them, and a resumed on-policy run equal to the uninterrupted one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.errors import DihalValueError
from dihal_fast.hybrid import HybridLM
from dihal_fast.hybrid.generation import Float64Sampling
from dihal_fast.replace import BridgeTrainConfig, train_bridge
from dihal_fast.replace.objective import kd_loss
from dihal_fast.replace.on_policy import own_continuations

TEXT = "\n\n".join(f"The fox {i} and the dog read {i % 7} books by the river {i % 3}." for i in range(300))
SMALL = {"width": 32, "heads": 2, "time_dim": 16}
TIMING = {"elapsed_s", "seconds", "tokens_per_s", "lr"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(TEXT)
    return path


def _config(**overrides) -> BridgeTrainConfig:
    options = dict(seq_len=16, batch_size=2, val_blocks=2, stats_blocks=4, steps=4, log_every=1, warmup_steps=1)
    return BridgeTrainConfig(**{**options, "bridge": SMALL, **overrides})


@pytest.mark.parametrize("shape", [(1, 1, 2), (2, 3, 7), (3, 5, 33)])
def test_reverse_distillation_matches_its_float64_formula(shape):
    generator = torch.Generator().manual_seed(sum(shape))
    teacher, student = (20 * torch.randn(*shape, generator=generator) for _ in range(2))
    for temperature in (0.5, 1.0, 3.0):
        p = torch.softmax(teacher.double() / temperature, -1).numpy()
        q = torch.softmax(student.double() / temperature, -1).numpy()
        expected = temperature**2 * np.mean(np.sum(q * (np.log(q + 1e-300) - np.log(p + 1e-300)), -1))
        got = float(kd_loss(teacher, student, temperature, "reverse"))
        assert got == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert float(kd_loss(teacher, teacher, 1.0, "reverse")) == pytest.approx(0.0, abs=1e-6)


def test_own_continuations_keep_the_prompt_and_draw_the_rest_token_by_token_from_the_hybrid(tiny_checkpoints):
    backbone, tokenizer = load_causal_lm(tiny_checkpoints["llama"])
    torch.manual_seed(0)
    hybrid = HybridLM.from_backbone(backbone, 1, tokenizer=tokenizer).eval()
    torch.nn.init.normal_(hybrid.bridge.out.weight, std=0.1)  # a bridge whose output depends on its input
    ids = torch.randint(3, hybrid.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    out = own_continuations(hybrid, ids, 4, torch.Generator().manual_seed(7))
    assert out.shape == ids.shape and torch.equal(out[:, :4], ids[:, :4]) and not torch.equal(out, ids)
    # the same draws by full recomputation, one position at a time (no cache)
    sampler, expected = Float64Sampling(1.0, None, 1.0, torch.Generator().manual_seed(7)), ids[:, :4]
    with torch.no_grad():
        for _ in range(8):
            scores = sampler(expected, hybrid(expected).logits[:, -1].float())
            expected = torch.cat([expected, scores.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, expected)


def test_on_policy_steps_distil_without_the_next_token_loss(tiny_checkpoints, corpus, tmp_path):
    train_bridge(
        tiny_checkpoints["llama"],
        2,
        corpus,
        tmp_path / "run",
        _config(on_policy_every=2, on_policy_prefix=6, copied_layers=0),
    )
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [("lm" in r, "kd" in r) for r in records] == [(False, True), (True, True)] * 2


def _losses(run) -> list[dict]:
    """The run's logged rows without their timings."""
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


class _Crash(Exception):
    pass


def test_a_resumed_on_policy_run_equals_the_uninterrupted_one(tiny_checkpoints, corpus, tmp_path):
    config = _config(on_policy_every=1, on_policy_prefix=5, kd_divergence="reverse", checkpoint_every=2)

    def crash(info):
        if info.step == 3:
            raise _Crash

    train_bridge(tiny_checkpoints["llama"], 1, corpus, tmp_path / "straight", config)
    with pytest.raises(_Crash):
        train_bridge(tiny_checkpoints["llama"], 1, corpus, tmp_path / "resumed", config, callback=crash)
    train_bridge(tiny_checkpoints["llama"], 1, corpus, tmp_path / "resumed", config, resume=True)

    assert _losses(tmp_path / "resumed") == _losses(tmp_path / "straight")
    assert all("lm" not in row and row["kd"] > 0 for row in _losses(tmp_path / "straight"))


@pytest.mark.parametrize(
    ("overrides", "words"),
    [({"w_kd": 0.0}, "--w-kd > 0"), ({"on_policy_prefix": 16}, "--on-policy-prefix below --seq-len")],
)
def test_on_policy_settings_that_cannot_work_are_refused(overrides, words):
    with pytest.raises(DihalValueError, match=words.replace("+", r"\+")):
        _config(on_policy_every=1, **overrides)


def test_on_policy_steps_under_zero3_draw_and_train_as_plain_torch(tiny_checkpoints, corpus, tmp_path):
    config = _config(steps=2, on_policy_every=1, on_policy_prefix=6)
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    train_bridge(tiny_checkpoints["llama"], 2, corpus, tmp_path / "plain", config)
    train_bridge(tiny_checkpoints["llama"], 2, corpus, tmp_path / "zero", config, deepspeed_config=tmp_path / "ds.json")
    for plain, zero in zip(_losses(tmp_path / "plain"), _losses(tmp_path / "zero"), strict=True):
        assert plain.keys() == zero.keys()
        for name in ("diff", "rec", "kd", "loss"):
            assert zero[name] == pytest.approx(plain[name], rel=1e-5), name
