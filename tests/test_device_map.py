"""``--device-map``: a checkpoint (backbone or hybrid) placed by accelerate's strategies scores and generates
exactly as the plain load does; a hybrid spread over two places (CPU + disk offload, accelerate's hooks between
them, which is what a split over GPUs runs through) too; each rank of a node gets its own GPUs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dihal_fast.common.devices import rank_gpus, rank_max_memory, ranks_per_node
from dihal_fast.common.hf_loading import load_causal_lm, placement
from dihal_fast.evaluate.loaded_lm import describe_placement, load_lm
from dihal_fast.hybrid import HybridLM

PROMPT = "The quick brown fox"
STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


@pytest.fixture(scope="module")
def checkpoints(tiny_checkpoints, tmp_path_factory):
    """``{"backbone": dir, "hybrid": dir}``: the tiny Llama and a hybrid cut from it at layer 2."""
    model, tokenizer = load_causal_lm(tiny_checkpoints["llama"])
    torch.manual_seed(0)
    hybrid = HybridLM.from_backbone(model, 2, {"width": 32, "heads": 2}, tokenizer, tiny_checkpoints["llama"])
    torch.nn.init.normal_(hybrid.bridge.out.weight, std=0.3)  # a fresh bridge outputs the mean: make it depend on x
    directory = hybrid.save_pretrained(tmp_path_factory.mktemp("hybrid") / "hybrid")
    return {"backbone": tiny_checkpoints["llama"], "hybrid": directory}


def _outputs(model, tokenizer) -> tuple[float, list, list]:
    """Loss on the prompt, greedy tokens, float64-protocol samples: what a placement must not change."""
    from dihal_fast.hybrid.generation import float64_sampling

    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        loss = model(ids, labels=ids).loss.item()
        greedy = model.generate(ids, max_new_tokens=6, do_sample=False).tolist()
        sampled = model.generate(
            ids.expand(3, -1), max_new_tokens=6, **float64_sampling(1.0, generator=torch.Generator().manual_seed(0))
        ).tolist()
    return loss, greedy, sampled


@pytest.mark.parametrize("kind", ["backbone", "hybrid"])
def test_strategies_give_the_plain_loads_numbers(checkpoints, kind):
    plain = _outputs(*load_causal_lm(checkpoints[kind], "auto", "cpu"))
    for strategy in STRATEGIES:
        model, tokenizer = load_causal_lm(checkpoints[kind], "auto", "cpu", strategy)
        assert describe_placement(model) == "cpu"
        assert _outputs(model, tokenizer) == plain, strategy


def test_a_hybrid_spread_over_two_places_gives_the_same_numbers(checkpoints, tmp_path):
    """accelerate's hooks between the parts (here CPU and disk offload: the bridge and the head on disk, the
    retained layers on the CPU) move the hidden states, the bridge's noise and the cache where each part runs."""
    from transformers import AutoModelForCausalLM

    plain = load_causal_lm(checkpoints["hybrid"], "auto", "cpu")
    size = sum(p.numel() * p.element_size() for p in plain[0].parameters())
    spread = AutoModelForCausalLM.from_pretrained(
        checkpoints["hybrid"], device_map="auto", max_memory={"cpu": int(0.85 * size)}, offload_folder=str(tmp_path)
    ).eval()
    assert {"cpu", "disk"} <= set(spread.hf_device_map.values()), spread.hf_device_map
    assert _outputs(spread, plain[1]) == _outputs(*plain)


def test_generate_stage_with_a_device_map_samples_the_same(checkpoints):
    from dihal_fast.pipeline import GenerateConfig, generate

    config = {"model": str(checkpoints["hybrid"]), "prompt": [PROMPT], "n_samples": 2, "max_new_tokens": 5}
    plain = generate(GenerateConfig(**config, device="cpu"))
    mapped = generate(GenerateConfig(**config, device="cpu", device_map="auto"))
    assert [s["token_ids"] for s in mapped["samples"]] == [s["token_ids"] for s in plain["samples"]]


def test_evaluate_stage_with_a_device_map_reports_the_same(checkpoints, tmp_path):
    from dihal_fast.evaluate.harness import EvalProtocolConfig
    from dihal_fast.pipeline import EvaluateConfig, evaluate

    corpus = tmp_path / "text.txt"
    corpus.write_text("\n\n".join(f"Story {i}: a fox and a dog went to the river {i % 7}." for i in range(40)))
    settings = EvalProtocolConfig(seq_len=16, eval_blocks=2, batch_size=2, n_samples=2, max_new_tokens=6, nfe=2)
    reports = {}
    for device_map in ("none", "auto"):
        config = EvaluateConfig(
            hybrid=str(checkpoints["hybrid"]),
            corpus=[str(corpus)],
            backbone=str(checkpoints["backbone"]),
            evaluator=str(checkpoints["backbone"]),
            device="cpu",
            device_map=device_map,
            settings=settings,
        )
        reports[device_map] = evaluate(config, tmp_path / device_map)
    for name in ("backbone", "hybrid"):
        for key in ("nll", "kl", "gen_ppl", "entropy", "diversity_dihal"):
            assert reports["auto"][name][key] == reports["none"][name][key], (name, key)
    assert reports["auto"]["samples"] == reports["none"]["samples"]


@given(st.integers(1, 16), st.integers(1, 8))
def test_each_rank_of_a_node_gets_its_own_gpus(n_gpus, ranks):
    owned = []
    for rank in range(ranks):
        if rank >= n_gpus:
            with pytest.raises(ValueError, match="has no GPU"):
                rank_gpus(n_gpus, rank, ranks)
            continue
        gpus = rank_gpus(n_gpus, rank, ranks)
        assert gpus[0] == rank  # the rank's own cuda:LOCAL_RANK, where DeepSpeed and torchrun put it
        owned += gpus
    assert sorted(owned) == list(range(n_gpus)) if n_gpus >= ranks else len(owned) == len(set(owned))


def test_rank_max_memory_names_only_the_ranks_gpus_and_its_host_share():
    free = {0: 80, 1: 81, 2: 82, 3: 83, "cpu": 1000}
    assert rank_max_memory(free, rank_gpus(4, 1, 2), 2) == {1: 81, 3: 83, "cpu": 500}
    assert rank_max_memory(free, None, 4) == {"cpu": 250}


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, 1),
        ({"WORLD_SIZE": "1"}, 1),
        ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, 4),  # torchrun
        ({"WORLD_SIZE": "8", "LOCAL_SIZE": "2"}, 2),  # the deepspeed launcher
        ({"WORLD_SIZE": "8", "SLURM_NTASKS_PER_NODE": "8"}, 8),
    ],
)
def test_ranks_per_node_from_each_launcher(env, expected):
    assert ranks_per_node(env) == expected


def test_ranks_per_node_unknown_under_a_launcher_is_one_line():
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
        ranks_per_node({"WORLD_SIZE": "4", "RANK": "0"})
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE must be an integer"):
        ranks_per_node({"LOCAL_WORLD_SIZE": "two"})


def test_placement_refuses_what_cannot_work():
    with pytest.raises(ValueError, match="pins one"):
        placement(torch.device("cuda:1"), "auto")
    with pytest.raises(ValueError, match="--device-map must be one of"):
        placement(torch.device("cpu"), "everywhere")
    assert placement(torch.device("cpu"), "none") == {}
    cpu_only = placement(torch.device("cpu"), "balanced")
    assert cpu_only["device_map"] == "balanced" and set(cpu_only["max_memory"]) == {"cpu"}


def test_load_lm_logs_where_the_model_is(checkpoints):
    lm = load_lm(checkpoints["hybrid"], device="cpu", device_map="sequential")
    assert lm.device == torch.device("cpu") and lm.kind == "hybrid"


def test_evaluate_refuses_an_unplaceable_device_map_before_its_run_directory(tmp_path, monkeypatch, capsys):
    from dihal_fast.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")  # a launcher that did not say how many ranks share this node
    monkeypatch.setenv("RANK", "0")
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    argv = ["evaluate", "--hybrid", str(tmp_path / "h"), "--out", str(tmp_path / "run"), "--device-map", "auto"]
    assert main([*argv, "--device", "cpu"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "LOCAL_WORLD_SIZE" in errors[0], errors
    assert not (tmp_path / "run").exists()
