"""The names deprecated in 0.3 are gone: the old attribute is an AttributeError, the old module does not import,
and the new names are the ones the packages export."""

import importlib
from pathlib import Path

import pytest

import dihal_fast

REMOVED_ATTRIBUTES = [
    ("dihal_fast.pipeline", "DemoSettings", "DemoBudgetConfig"),
    ("dihal_fast.pipeline.demo_stage", "DemoSettings", "DemoBudgetConfig"),
    ("dihal_fast.pipeline", "SweepSettings", "SweepBudgetConfig"),
    ("dihal_fast.pipeline.sweep_stage", "SweepSettings", "SweepBudgetConfig"),
    ("dihal_fast.evaluate.harness", "EvalSettings", "EvalProtocolConfig"),
]
REMOVED_MODULES = [
    ("dihal_fast.evaluate.metrics", "dihal_fast.common.metrics"),
    ("dihal_fast.evaluate.sampling", "dihal_fast.common.sampling"),
    ("dihal_fast.common.deprecation", None),
]


@pytest.mark.parametrize(("module", "old", "new"), REMOVED_ATTRIBUTES)
def test_an_old_name_is_an_attribute_error(module, old, new):
    namespace = importlib.import_module(module)
    assert getattr(namespace, new) is not None
    with pytest.raises(AttributeError, match=f"no attribute '{old}'"):
        getattr(namespace, old)


@pytest.mark.parametrize(("old", "new"), REMOVED_MODULES)
def test_an_old_module_does_not_import(old, new):
    """The source file is gone and the import fails (ModuleNotFoundError; an editable install made before the
    removal still maps the old file and raises FileNotFoundError until it is reinstalled)."""
    assert not (Path(dihal_fast.__file__).parent.parent / (old.replace(".", "/") + ".py")).exists()
    with pytest.raises((ModuleNotFoundError, FileNotFoundError)):
        importlib.import_module(old)
    if new is not None:
        assert importlib.import_module(new).__name__ == new
