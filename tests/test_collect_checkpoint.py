"""The collection checkpoint is streamed to disk part by part (issue 21): a save holds one part's bytes at a time,
a save killed midway leaves the previous checkpoint whole and resumable bit-identically, and a checkpoint of the
earlier single-file layout is still resumed."""

from __future__ import annotations

import json
import tracemalloc

import pytest
import torch
from safetensors.torch import load_file, save_file

from dihal_fast.collect import CheckpointStore, CollectConfig, LayerStatistics, collect
from dihal_fast.collect import state_store as checkpoint_module

BATCH = 4
MANIFEST = "state-rank0000-of-0001.json"
LEGACY = "state-rank0000-of-0001.safetensors"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("Once upon a time there was a fox who read 12 books and 345 poems by the lazy river.\n\n" * 60)
    return path


def _config(model, corpus) -> CollectConfig:
    return CollectConfig(
        model=str(model), corpus=[str(corpus)], seq_len=24, batch_size=BATCH, max_tokens=24 * 24, reservoir_size=150
    )


def _assert_same_statistics(a: LayerStatistics, b: LayerStatistics) -> None:
    one, two = a.state_dict(), b.state_dict()
    assert one.keys() == two.keys()
    for name in one:
        assert torch.equal(one[name], two[name]), name  # bit-identical: the same updates in the same order


@pytest.fixture(scope="module")
def whole(tiny_checkpoints, corpus, tmp_path_factory):
    """One uninterrupted collection: what every resumed one must equal."""
    return collect(_config(tiny_checkpoints["llama"], corpus), tmp_path_factory.mktemp("whole") / "run", progress=False)


def test_the_checkpoint_is_a_manifest_naming_one_part_per_layer(tiny_checkpoints, corpus, tmp_path):
    collect(_config(tiny_checkpoints["llama"], corpus), tmp_path / "run", max_batches=2, progress=False)
    folder = tmp_path / "run" / "collect"
    manifest = json.loads((folder / MANIFEST).read_text())
    layers = range(5)  # the tiny 4-layer Llama's hidden states 0..4
    assert set(manifest["files"]) == {
        "reservoir.safetensors",
        *(f"cov-{layer}.safetensors" for layer in layers),
        *(f"reservoir-{layer}.safetensors" for layer in layers),
    }
    assert manifest["progress"]["batches_done"] == 2 and not (folder / LEGACY).exists()
    assert [p.name for p in folder.glob("state-*.parts-*")] == [manifest["parts"]]  # older states are deleted


class _Killed(Exception):
    """What a kill -9 in the middle of a checkpoint write does to the writer."""


def test_a_save_killed_midway_keeps_the_previous_checkpoint(tiny_checkpoints, corpus, tmp_path, monkeypatch, whole):
    config, run = _config(tiny_checkpoints["llama"], corpus), tmp_path / "run"
    collect(config, run, max_batches=3, progress=False)
    before = (run / "collect" / MANIFEST).read_text()
    written, write = [], checkpoint_module.atomic_write_bytes

    def dies_at_the_third_part(path, data):
        if len(written) == 2:
            raise _Killed(path)
        written.append(path)
        return write(path, data)

    monkeypatch.setattr(checkpoint_module, "atomic_write_bytes", dies_at_the_third_part)
    with pytest.raises(_Killed):
        collect(config, run, resume=True, max_batches=2, progress=False)
    monkeypatch.undo()
    assert (run / "collect" / MANIFEST).read_text() == before  # the old checkpoint, whole
    assert len(list((run / "collect").glob("state-*.parts-*"))) == 2  # and the half-written folder beside it
    final = collect(config, run, resume=True, progress=False)
    assert final.complete and final.n_blocks == whole.n_blocks
    _assert_same_statistics(final.statistics, whole.statistics)
    assert len(list((run / "collect").glob("state-*.parts-*"))) == 1


def test_a_checkpoint_of_the_single_file_layout_is_resumed(tiny_checkpoints, corpus, tmp_path, whole):
    config, run = _config(tiny_checkpoints["llama"], corpus), tmp_path / "run"
    collect(config, run, max_batches=3, progress=False)
    folder = run / "collect"
    manifest = json.loads((folder / MANIFEST).read_text())
    tensors = {}
    for name in manifest["files"]:
        tensors.update(load_file(folder / manifest["parts"] / name))
    save_file(tensors, str(folder / LEGACY), metadata={"progress": json.dumps(manifest["progress"])})
    (folder / MANIFEST).unlink()
    for part in (folder / manifest["parts"]).iterdir():
        part.unlink()
    (folder / manifest["parts"]).rmdir()
    final = collect(config, run, resume=True, progress=False)
    _assert_same_statistics(final.statistics, whole.statistics)
    assert (folder / MANIFEST).is_file() and not (folder / LEGACY).exists()  # rewritten in the streamed layout


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.update(format="dihal-collect-state/9"), "not a dihal-collect-state/2 manifest"),
        (lambda m: m.update(parts="../../elsewhere"), "field 'parts' is '../../elsewhere'"),
        (lambda m: m.update(parts=m["parts"] + "/../../x"), "field 'parts' is 'state-rank0000-of-0001.parts-"),
        (lambda m: m.update(files=[]), "field 'files' is"),
        (lambda m: m["files"].update({"../config.json": 10}), "is missing or not the 10 bytes"),
        (lambda m: m["files"].pop("cov-2.safetensors"), "covariance state is missing"),
    ],
)
def test_an_edited_manifest_is_refused_in_one_line(tiny_checkpoints, corpus, tmp_path, edit, message):
    config, run = _config(tiny_checkpoints["llama"], corpus), tmp_path / "run"
    collect(config, run, max_batches=2, progress=False)
    path = run / "collect" / MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=message) as info:
        collect(config, run, resume=True, progress=False)
    assert "\n" not in str(info.value) and MANIFEST in str(info.value)


def test_a_save_holds_one_part_at_a_time(tmp_path):
    """tracemalloc sees the copies a save makes (NumPy arrays, serialised bytes): at most about three of the
    largest part, where the single-file layout held the whole state's bytes at once."""
    layers, dim, capacity = range(1, 9), 128, 1000
    stats = LayerStatistics(layers, dim, capacity)
    stats.reservoir.size = capacity
    for layer in layers:
        stats.reservoir.vectors[layer].normal_()
    store = CheckpointStore(tmp_path)
    whole_state = sum(t.numel() * t.element_size() for t in stats.state_dict().values())
    largest_part = max(capacity * dim * 4, dim * dim * 8)
    tracemalloc.start()
    try:
        store.save(stats, {"blocks_done": 0, "batches_done": 0, "exhausted": False})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3.5 * largest_part < whole_state / 2, (peak, largest_part, whole_state)


def test_a_damaged_manifest_is_refused_and_its_parts_are_kept(tiny_checkpoints, corpus, tmp_path):
    config, run = _config(tiny_checkpoints["llama"], corpus), tmp_path / "run"
    collect(config, run, max_batches=2, progress=False)
    (run / "collect" / MANIFEST).write_text('{"format": "dihal-collect-st')  # cut short by a full disk, say
    with pytest.raises(ValueError, match=f"{MANIFEST} is corrupt.*not valid JSON"):
        collect(config, run, resume=True, progress=False)
    assert len(list((run / "collect").glob("state-*.parts-*"))) == 1  # left for the user to repair or delete
