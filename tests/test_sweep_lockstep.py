"""The sweep's bridges trained together (one teacher forward pass per batch for all layers) give every layer
bit for bit the run that ``train_bridge`` gives it alone: losses, logs, checkpoints, exported hybrid."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from dihal_fast.replace import BridgeTrainConfig, train_bridge
from dihal_fast.replace.lockstep import SharedTeacher, train_bridges

LAYERS = [1, 3]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    generator = torch.Generator().manual_seed(1)
    words = "the cat dog sat ran on a mat tree red blue and then it was day night".split()
    lines = [" ".join(words[i] for i in torch.randint(0, len(words), (9,), generator=generator)) for _ in range(150)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(lines) + "\n")
    return path


def _config() -> BridgeTrainConfig:
    # context_layers left at its default (one block per replaced layer): the layers' bridges differ in size
    return BridgeTrainConfig(
        seq_len=16,
        batch_size=4,
        val_blocks=4,
        stats_blocks=8,
        steps=5,
        checkpoint_every=2,
        log_every=1,
        warmup_steps=2,
        bridge={"width": 32, "heads": 2, "time_dim": 16},
    )


def _log(run_dir):
    """The log lines without their wall-clock field."""
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "elapsed_s"} for row in rows]


def _assert_same_run(alone, together):
    first, second = (json.loads((d / "result.json").read_text()) for d in (alone, together))
    assert first["bridge_loss"] == second["bridge_loss"] and first["validation"] == second["validation"]
    assert _log(alone) == _log(together)
    assert (alone / "bridge_config.json").read_text() == (together / "bridge_config.json").read_text()
    for name in ("checkpoints/step_00000005/weights.safetensors", "checkpoints/step_00000005/ema.safetensors"):
        a, b = load_file(alone / name), load_file(together / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    a, b = load_file(alone / "hybrid" / "model.safetensors"), load_file(together / "hybrid" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_lockstep_bridges_equal_separate_runs(tiny_checkpoints, corpus, tmp_path, family):
    model, config = tiny_checkpoints[family], _config()
    for layer in LAYERS:
        train_bridge(model, layer, corpus, tmp_path / "alone" / f"layer_{layer}", config)
    dirs = {layer: tmp_path / "together" / f"layer_{layer}" for layer in LAYERS}
    results = train_bridges(model, LAYERS, corpus, dirs, config)
    assert sorted(results) == LAYERS
    for layer in LAYERS:
        assert results[layer]["layer"] == layer and results[layer]["hybrid_dir"] == str(dirs[layer] / "hybrid")
        _assert_same_run(tmp_path / "alone" / f"layer_{layer}", dirs[layer])


class _Crash(Exception):
    pass


def test_lockstep_resumes_layers_stopped_at_different_steps(tiny_checkpoints, corpus, tmp_path):
    """Layer 2 was killed after its step-2 checkpoint, layer 3 never started: both continue together and end as
    their uninterrupted runs."""
    model, config = tiny_checkpoints["qwen3"], _config()
    for layer in (2, 3):
        train_bridge(model, layer, corpus, tmp_path / "alone" / f"layer_{layer}", config)

    def crash(info):
        if info.step == 3:
            raise _Crash

    dirs = {layer: tmp_path / "together" / f"layer_{layer}" for layer in (2, 3)}
    with pytest.raises(_Crash):
        train_bridge(model, 2, corpus, dirs[2], config, callback=crash)
    train_bridges(model, [2, 3], corpus, dirs, config)
    for layer in (2, 3):
        _assert_same_run(tmp_path / "alone" / f"layer_{layer}", dirs[layer])


def test_shared_teacher_is_backbone_targets_with_one_pass_per_batch(tiny_checkpoints):
    from dihal_fast.common.hf_loading import load_causal_lm
    from dihal_fast.hybrid import backbone_targets

    backbone, _ = load_causal_lm(tiny_checkpoints["llama"])
    layers = [1, 2, 3]
    teacher = SharedTeacher(backbone, layers, capacity=2)
    batches = [
        torch.randint(0, backbone.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(i))
        for i in range(3)
    ]
    with torch.no_grad():
        for ids in batches[:2]:
            for layer in layers:
                hidden, logits = teacher(ids.clone(), layer)
                want_hidden, want_logits = backbone_targets(backbone, ids, layer)
                assert torch.equal(hidden, want_hidden) and torch.equal(logits, want_logits)
        assert teacher.passes == 2
        teacher(batches[2], 1)  # evicts the oldest batch
        teacher(batches[1], 2)
        teacher(batches[0], 3)
    assert teacher.passes == 4
    with pytest.raises(ValueError, match="layer 4 is not one of"):
        teacher(batches[0], 4)
    with pytest.raises(ValueError, match="capacity >= 1"):
        SharedTeacher(backbone, layers, capacity=0)


def test_train_bridges_refuses_a_layer_without_a_directory(tiny_checkpoints, corpus, tmp_path):
    with pytest.raises(ValueError, match="need a run directory for each of the layers"):
        train_bridges(tiny_checkpoints["llama"], [1, 2], corpus, {1: tmp_path / "one"}, _config())
    with pytest.raises(ValueError, match="layer must be an integer in 1..3"):
        train_bridges(tiny_checkpoints["llama"], [1, 9], corpus, {1: tmp_path / "a", 9: tmp_path / "b"}, _config())
    assert not (tmp_path / "a").exists()


def test_worker_processes_give_every_layer_the_same_run(tiny_checkpoints, corpus, tmp_path):
    """Two one-thread worker processes, each training its share of the layers: the runs of one process (one
    thread, for bit-equal GEMMs), layer by layer; a partly trained layer resumes in its worker."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, config, layers = tiny_checkpoints["qwen3"], _config(), [1, 2, 3]
        one = {layer: tmp_path / "one" / f"layer_{layer}" for layer in layers}
        train_bridges(model, layers, corpus, one, config)
        two = {layer: tmp_path / "two" / f"layer_{layer}" for layer in layers}

        def crash(info):
            if info.step == 3:
                raise _Crash

        with pytest.raises(_Crash):
            train_bridge(model, 2, corpus, two[2], config, callback=crash)
        results = train_bridges(model, layers, corpus, two, config, workers=2)
    finally:
        torch.set_num_threads(threads)
    assert sorted(results) == layers and all(
        results[layer]["hybrid_dir"] == str(two[layer] / "hybrid") for layer in layers
    )
    for layer in layers:
        _assert_same_run(one[layer], two[layer])


def test_split_layers_balances_the_layers_above():
    from dihal_fast.replace.lockstep import split_layers

    groups = split_layers(list(range(1, 16)), 2, 16)
    assert sorted(layer for group in groups for layer in group) == list(range(1, 16))
    assert all(group == sorted(group) for group in groups)
    costs = [sum(16 - layer + 2 for layer in group) for group in groups]
    assert max(costs) - min(costs) <= 2  # 150 in all: 74 / 76 or better
    assert split_layers([4, 2], 8, 6) == [[4], [2]] or split_layers([4, 2], 8, 6) == [[2], [4]]
    assert len(split_layers([1, 2, 3], 1, 4)) == 1


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_train_bridges_refuses_a_bad_worker_count(tiny_checkpoints, corpus, tmp_path, workers):
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        train_bridges(
            tiny_checkpoints["llama"], [1, 2], corpus, {1: tmp_path / "a", 2: tmp_path / "b"}, _config(), workers
        )
    assert not (tmp_path / "a").exists()


def test_sweep_worker_count(monkeypatch):
    from dihal_fast.pipeline.sweep_stage import bridge_workers

    monkeypatch.setenv("DIHAL_NUM_THREADS", "3")
    assert bridge_workers(0, "cpu", 15) == 3  # the pinned threads, one per process
    assert bridge_workers(0, "cpu", 2) == 2  # at most one per layer
    assert bridge_workers(5, "cpu", 15) == 5 and bridge_workers(1, "cpu", 15) == 1
    monkeypatch.setenv("DIHAL_NUM_THREADS", "auto")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert bridge_workers(0, "cpu", 15) == min(torch.get_num_threads(), 15)
