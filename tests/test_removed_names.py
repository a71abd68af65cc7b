"""Renamed public names still work, with a DeprecationWarning, until they are removed (common.deprecation)."""

import importlib

import pytest

from dihal_fast.common.deprecation import REMOVED_IN

RENAMED = [
    ("dihal_fast.pipeline", "DemoSettings", "DemoBudgetConfig"),
    ("dihal_fast.pipeline.demo_stage", "DemoSettings", "DemoBudgetConfig"),
    ("dihal_fast.pipeline", "SweepSettings", "SweepBudgetConfig"),
    ("dihal_fast.pipeline.sweep_stage", "SweepSettings", "SweepBudgetConfig"),
    ("dihal_fast.evaluate.harness", "EvalSettings", "EvalProtocolConfig"),
]


@pytest.mark.parametrize(("module", "old", "new"), RENAMED)
def test_an_old_name_warns_and_is_the_new_object(module, old, new):
    namespace = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated and will be removed in {REMOVED_IN}; use {new}"):
        value = getattr(namespace, old)
    assert value is getattr(namespace, new)


@pytest.mark.parametrize("module", sorted({module for module, _, _ in RENAMED}))
def test_an_unknown_name_is_still_an_attribute_error(module):
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        _ = importlib.import_module(module).NoSuchName
