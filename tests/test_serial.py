"""The one config (de)serialisation (common.serial): round trips, history declarations, the resume diff."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dihal_fast.backbone.config import BackboneTrainConfig
from dihal_fast.bridge import BridgeConfig
from dihal_fast.collect.config import CollectConfig
from dihal_fast.common.serial import SerialConfig
from dihal_fast.controls import DiffusionLMConfig
from dihal_fast.hcdlm import RunConfig
from dihal_fast.replace.config import BridgeTrainConfig


@dataclass
class Inner(SerialConfig):
    legacy = {"added": 0}
    width: int = 8
    added: int = 3


@dataclass
class Outer(SerialConfig):
    renamed = {"rate": "lr"}
    lr: float = 0.1
    inner: Inner = field(default_factory=Inner)
    name: str = "x"


def test_nested_round_trip_through_json():
    config = Outer(lr=0.5, inner=Inner(width=4, added=7), name="y")
    assert Outer.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_renamed_keys_and_legacy_fields_of_an_old_save():
    old = {"rate": 0.2, "inner": {"width": 16}}  # saved before 'added' existed, with 'lr' under its old name
    config = Outer.from_dict(old)
    assert config == Outer(lr=0.2, inner=Inner(width=16, added=0), name="x")


def test_unknown_and_missing_keys_name_the_class():
    with pytest.raises(ValueError, match=r"unknown Inner keys \['depth'\]"):
        Outer.from_dict({"inner": {"depth": 2}})
    with pytest.raises(ValueError, match="must be read from a JSON object, got list"):
        Outer.from_dict([])
    with pytest.raises(ValueError, match="key 'inner' must be an object, got str"):
        Outer.from_dict({"inner": "wide"})
    with pytest.raises(ValueError, match=r"BridgeConfig lacks the keys \['condition_size'"):
        BridgeConfig.from_dict({"hidden_size": 8})


def test_comparable_to_drops_only_legacy_fields_at_their_old_value():
    saved = {"lr": 0.1, "inner": {"width": 8}, "name": "x"}
    assert Outer(inner=Inner(added=0)).comparable_to(saved) == saved
    assert Outer(inner=Inner(added=0)).differences(saved) == []
    assert Outer(inner=Inner(added=5)).differences(saved) == ["inner.added: saved None, now 5"]
    assert Outer(lr=0.3).differences(saved, ignore=("lr",)) == ["inner.added: saved None, now 3"]
    assert Outer(lr=0.3, inner=Inner(added=0)).differences(saved, ignore=("lr",)) == []


def test_save_and_load_name_the_file(tmp_path):
    Outer(lr=0.25).save(tmp_path / "c.json")
    assert Outer.load(tmp_path / "c.json") == Outer(lr=0.25)
    (tmp_path / "bad.json").write_text('{"inner": {"depth": 1}}')
    with pytest.raises(ValueError, match=r"bad.json: unknown Inner keys"):
        Outer.load(tmp_path / "bad.json")
    (tmp_path / "run.json").write_text('{"train": {"steps": "many"}}')  # a checked config's TypeError, with the file
    with pytest.raises(ValueError, match=r"run.json: --steps must be an integer"):
        RunConfig.load(tmp_path / "run.json")


@pytest.mark.parametrize(
    "config",
    [
        BridgeTrainConfig(steps=7, bridge={"width": 32}),
        BackboneTrainConfig(corpus=["a.txt"], steps=11),
        CollectConfig(model="m", corpus=["c.txt"]),
        RunConfig(),
        DiffusionLMConfig(width=64, heads=2),
        BridgeConfig(hidden_size=8, condition_size=8, layer=2),
    ],
    ids=lambda c: type(c).__name__,
)
def test_every_family_config_uses_the_one_base(config):
    assert isinstance(config, SerialConfig)
    again = type(config).from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config and again.differences(config.to_dict()) == []


@given(st.integers(1, 10**6), st.integers(0, 10**6))
def test_differences_list_exactly_the_changed_fields(width, added):
    base = Outer()
    changed = dataclasses.replace(base, inner=Inner(width=width, added=added))
    expected = [f"inner.{k}" for k in ("added", "width") if getattr(changed.inner, k) != getattr(base.inner, k)]
    assert [line.split(":")[0] for line in changed.differences(base.to_dict())] == expected
