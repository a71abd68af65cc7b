"""A resumed ``replace`` run is whole (issue 21): after a crash and ``--resume`` every file of the run equals the
uninterrupted run's, timing fields aside (validation.json kept 2 of 30 history entries)."""

from __future__ import annotations

import pytest
from test_kill_anywhere import CONFIG, corpus, run_files  # noqa: F401  (corpus: the fixture)

from dihal_fast.replace import BridgeTrainConfig, train_bridge


class _Crash(Exception):
    pass


@pytest.mark.slow  # two bridge trainings: 40 s on 2 shared cores
def test_a_crashed_and_resumed_replace_run_equals_the_uninterrupted_one(tiny_checkpoints, corpus, tmp_path):  # noqa: F811
    config = BridgeTrainConfig(**CONFIG)
    model = tiny_checkpoints["llama"]
    train_bridge(model, 1, corpus, tmp_path / "straight", config)

    def crash(info):
        if info.step == 3:  # after the step-2 checkpoint and validation: step 3's row is lost, as in a kill
            raise _Crash

    with pytest.raises(_Crash):
        train_bridge(model, 1, corpus, tmp_path / "resumed", config, callback=crash)
    train_bridge(model, 1, corpus, tmp_path / "resumed", config, resume=True)
    straight, resumed = run_files(tmp_path / "straight"), run_files(tmp_path / "resumed")
    assert [h["step"] for h in straight["validation.json"]["history"]] == [2, 4]
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert straight[name] == resumed[name], name
