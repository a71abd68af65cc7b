"""Generated hostile values for every field of every command's configuration (issue 21).

For each config dataclass a command builds, hypothesis replaces one field with a hostile value (NaN, infinities,
huge and negative numbers, wrong types, odd strings) and checks the one validation point: the config is either
built with a value its declared constraints allow, or refused with one ``ValueError`` / ``TypeError`` line; the
``dihal`` command given the same value as its flag exits with status 2 and one error line, before any work."""

from __future__ import annotations

import dataclasses
import math
import numbers
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dihal_fast._native import BackendUnavailable
from dihal_fast.backbone.config import BackboneModelConfig, BackboneTrainConfig
from dihal_fast.cli import main
from dihal_fast.collect.config import CollectConfig
from dihal_fast.common.options import option  # noqa: F401  (the metadata these tests read)
from dihal_fast.common.validation import INT_LIMIT
from dihal_fast.evaluate.harness import EvalProtocolConfig
from dihal_fast.hcdlm.config import (
    HCDLMModelConfig,
    HCDLMTrainConfig,
    ObjectiveConfig,
    SampleConfig,
)
from dihal_fast.pipeline import LocateConfig, ReplaceConfig
from dihal_fast.pipeline.demo_stage import DemoBudgetConfig, DemoConfig
from dihal_fast.pipeline.generate_stage import GenerateConfig
from dihal_fast.pipeline.sweep_stage import SweepBudgetConfig, SweepConfig
from dihal_fast.replace.config import BridgeTrainConfig
from dihal_fast.tasks.registry import TaskConfig
from dihal_fast.testing.tiny import HCDLM_TINY, HCDLM_TINY_ARGS
from dihal_fast.train.settings import LoopSettings

CHECKED = [
    HCDLMModelConfig,
    ObjectiveConfig,
    HCDLMTrainConfig,
    SampleConfig,
    TaskConfig,
    LocateConfig,
    GenerateConfig,
    EvalProtocolConfig,
    BridgeTrainConfig,
    SweepBudgetConfig,
    SweepConfig,
    DemoBudgetConfig,
    DemoConfig,
    ReplaceConfig,
    BackboneModelConfig,
    BackboneTrainConfig,
    LoopSettings,
    CollectConfig,
]
# The fields a config needs besides the one under test (a required field, or one of two that must be given).
REQUIRED = {
    ReplaceConfig: {"layer": 1},
    BackboneTrainConfig: {"corpus": ["/nonexistent/dihal-hostile/train.txt"]},
    LoopSettings: {"steps": 1, "batch_size": 1, "lr": 1e-3, "warmup_steps": 0},
    CollectConfig: {"model": "/nonexistent/model", "corpus": ["/nonexistent/corpus.txt"]},
}
TINY = HCDLM_TINY_ARGS
# Each command, the argv that makes it valid but for the field under test (paths that do not exist: nothing
# may be loaded before the value is refused), and the configs it builds from its flags.
COMMANDS = {
    "hcdlm train": (
        [
            "hcdlm",
            "train",
            "--task",
            "sudoku",
            "--sudoku-box",
            "2x2",
            "--sudoku-pool",
            "20",
            "--steps",
            "1",
            *TINY,
            "--out",
            "/nonexistent/dihal-hostile/run",
        ],
        [HCDLMModelConfig, ObjectiveConfig, HCDLMTrainConfig, TaskConfig],
    ),
    "locate": (["locate", "--model", "/nonexistent/model", "--out", "/nonexistent/dihal-hostile/run"], [LocateConfig]),
    "generate": (["generate", "--model", "/nonexistent/model"], [GenerateConfig]),
    "replace": (
        ["replace", "--model", "/nonexistent/model", "--layer", "1", "--out", "/nonexistent/dihal-hostile/run"],
        [BridgeTrainConfig, ReplaceConfig],
    ),
    "backbone train": (
        [
            "backbone",
            "train",
            "--corpus",
            "/nonexistent/dihal-hostile/train.txt",
            "--out",
            "/nonexistent/dihal-hostile/run",
        ],
        [BackboneModelConfig, BackboneTrainConfig],
    ),
    "sweep": (
        ["sweep", "--model", "/nonexistent/model", "--out", "/nonexistent/dihal-hostile/run"],
        [SweepBudgetConfig],
    ),
    "demo": (["demo", "--model", "/nonexistent/model", "--out", "/nonexistent/dihal-hostile/run"], [DemoBudgetConfig]),
}
# The values a command's base argv gives other fields of a config (TINY), for the fields checked together.
CONTEXT = {
    ("hcdlm train", HCDLMModelConfig): HCDLM_TINY,
}
GIVEN = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)

HOSTILE_NUMBERS = st.one_of(
    st.sampled_from(
        [
            0,
            -1,
            1,
            2,
            -(2**63),
            2**63,
            2**70,
            -(2**70),
            0.5,
            1.5,
            -0.0,
            1e-320,
            1e308,
            -1e308,
            math.nan,
            math.inf,
            -math.inf,
            1e12,
            -1e12,
        ]
    ),
    st.integers(-(2**80), 2**80),
    st.floats(allow_nan=True, allow_infinity=True),
)
HOSTILE_VALUES = st.one_of(
    HOSTILE_NUMBERS,
    st.booleans(),
    st.none(),
    st.text(max_size=12),
    st.sampled_from(["", "nan", "inf", "-1", "cuda", "cuda:99", "auto", "x" * 300, "1x9", "0x0"]),
    st.lists(HOSTILE_NUMBERS, max_size=3),
)


def _fields(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init and not dataclasses.is_dataclass(f.type)]


def _allowed(value, hint, metadata) -> bool:
    """Whether ``value`` satisfies the declared constraints of a field of type ``hint`` (what an accepted value
    must)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if type(None) in args:
        if value is None:
            return True
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple)) and all(_allowed(v, args[0], metadata) for v in value)
    if hint is int:
        low = metadata.get("min", 0)
        return (
            isinstance(value, numbers.Integral)
            and not isinstance(value, bool)
            and low <= value <= metadata.get("max", INT_LIMIT)
        )
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            return False
        return (
            metadata.get("min", -math.inf) <= value <= metadata.get("max", math.inf)
            and value > metadata.get("gt", -math.inf)
            and value < metadata.get("lt", math.inf)
        )
    if hint is bool:
        return isinstance(value, bool)
    if hint is str:
        return isinstance(value, str) and value in metadata.get("choices", (value,))
    return True


def _one_line(exc: BaseException) -> None:
    assert str(exc) and "\n" not in str(exc), repr(exc)


@pytest.mark.parametrize("cls", CHECKED, ids=lambda c: c.__name__)
@GIVEN
@given(data=st.data())
def test_every_field_takes_an_allowed_value_or_refuses_it_in_one_line(cls, data):
    spec = data.draw(st.sampled_from(_fields(cls)), label="field")
    value = data.draw(HOSTILE_VALUES, label="value")
    hint = typing.get_type_hints(cls)[spec.name]
    try:
        cls(**{**REQUIRED.get(cls, {}), spec.name: value})
    except (ValueError, TypeError, BackendUnavailable) as exc:  # e.g. --backend cuda on this GPU-less machine
        _one_line(exc)
        return
    assert _allowed(value, hint, spec.metadata), f"{cls.__name__}.{spec.name} accepted {value!r}"


def _flag_cases() -> list[tuple[str, type, dataclasses.Field]]:
    cases = []
    for command, (_, classes) in COMMANDS.items():
        for cls in classes:
            hints = typing.get_type_hints(cls)
            for spec in _fields(cls):
                hint = hints[spec.name]
                if (
                    hint is bool
                    or typing.get_origin(hint) is list
                    or "options" in spec.metadata
                    or spec.name == "model"
                ):
                    continue  # switches, lists and paths have no single hostile value to type
                cases.append((command, cls, spec))
    return cases


FLAG_CASES = _flag_cases()


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's usage errors
        return exc.code


@GIVEN
@given(data=st.data())
def test_every_command_refuses_a_refused_value_in_one_line_before_any_work(data, capsys):
    command, cls, spec = data.draw(st.sampled_from(FLAG_CASES), label="flag")
    value = data.draw(
        HOSTILE_NUMBERS | st.sampled_from(["nan", "inf", "-1", "abc", "", "1e400", "0x10", "cuda:99"]), label="value"
    )
    hint = typing.get_type_hints(cls)[spec.name]
    as_parsed = str(value) if str in (hint, *typing.get_args(hint)) else value  # argparse hands a str field a string
    try:
        cls(**{**REQUIRED.get(cls, {}), **CONTEXT.get((command, cls), {}), spec.name: as_parsed})
        return  # a value the config takes: running the command would start the work
    except (ValueError, TypeError):
        pass
    base, _ = COMMANDS[command]
    flag = spec.metadata.get("flag", "--" + spec.name.replace("_", "-"))
    flag = flag if isinstance(flag, str) else flag[0]
    capsys.readouterr()
    assert _run([*base, flag, str(value)]) == 2, (command, flag, value)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in err, err


def test_the_suite_covers_every_field_of_every_command():
    """Every flag-typed field of every command is a case (a new field is covered by construction)."""
    assert len(FLAG_CASES) >= 100
    assert {c for c, _, _ in FLAG_CASES} == set(COMMANDS)
