"""What a bridge training step costs and how long a run trains: the teacher stopped at ``l*``, ``--lm-every``
(steps without the retained layers), the width-scaled rate, and ``--max-minutes`` with what result.json reports."""

from __future__ import annotations

import json

import pytest
import torch

from dihal_fast.common.hf_loading import load_causal_lm
from dihal_fast.hybrid import backbone_targets, hidden_state
from dihal_fast.replace import BridgeTrainConfig, train_bridge
from dihal_fast.replace.config import LR_WIDTH
from dihal_fast.testing.tiny import FAMILIES

TEXT = "\n\n".join(f"The fox {i} and the dog read {i % 7} books by the river {i % 3}." for i in range(300))
SMALL = {"width": 32, "heads": 2, "time_dim": 16}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(TEXT)
    return path


@pytest.mark.parametrize("family", FAMILIES)
def test_teacher_stopped_at_the_layer_gives_the_full_passes_hidden_state(tiny_checkpoints, family):
    model, _ = load_causal_lm(tiny_checkpoints[family])
    ids = torch.randint(3, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    for layer in (1, model.config.num_hidden_layers - 1):
        torch.testing.assert_close(hidden_state(model, ids, layer), backbone_targets(model, ids, layer)[0])


def _config(**overrides) -> BridgeTrainConfig:
    options = dict(seq_len=16, batch_size=2, val_blocks=2, stats_blocks=4, steps=6, log_every=1, warmup_steps=1)
    return BridgeTrainConfig(**{**options, "bridge": SMALL, **overrides})


def test_lm_every_leaves_the_retained_layers_out_between_its_steps(tiny_checkpoints, corpus, tmp_path):
    train_bridge(tiny_checkpoints["llama"], 2, corpus, tmp_path / "run", _config(lm_every=3, copied_layers=0))
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [("lm" in r, "kd" in r) for r in records] == [(True, True), (False, False), (False, False)] * 2
    assert all(r["rec"] > 0 and r["diff"] > 0 for r in records)


def test_without_next_token_and_distillation_weights_no_step_runs_the_retained_layers(
    tiny_checkpoints, corpus, tmp_path
):
    from dihal_fast.pipeline.sweep_stage import SweepBudgetConfig

    train = SweepBudgetConfig(w_lm=0.0, w_kd=0.0).train_config()
    assert (train.w_lm, train.w_kd) == (0.0, 0.0)
    train_bridge(tiny_checkpoints["llama"], 2, corpus, tmp_path / "run", _config(w_lm=0.0, w_kd=0.0, steps=3))
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [sorted(set(r) & {"lm", "kd", "diff", "rec"}) for r in records] == [["diff", "rec"]] * 3


def test_a_wide_bridge_trains_at_a_rate_scaled_by_its_width():
    config = BridgeTrainConfig(lr=2e-3)
    assert config.loop_settings(width=LR_WIDTH).lr == 2e-3
    assert config.loop_settings(width=64).lr == 2e-3  # narrower ones keep the full rate
    assert config.loop_settings(width=4 * LR_WIDTH).lr == pytest.approx(5e-4)


def test_a_time_budget_ends_the_run_and_result_json_says_what_it_trained(tiny_checkpoints, corpus, tmp_path):
    config = _config(steps=100_000, max_minutes=0.05, budget_clock="cpu", checkpoint_every=50)
    result = train_bridge(tiny_checkpoints["qwen3"], 1, corpus, tmp_path / "run", config)
    assert 0 < result["steps_trained"] < 100_000 and result["budget_clock"] == "cpu"
    assert result["tokens_seen"] == result["steps_trained"] * 2 * 16
    assert result["train_seconds"] >= 3.0
    assert result["validation"]["step"] == result["steps_trained"]
