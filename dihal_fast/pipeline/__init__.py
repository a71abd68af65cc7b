"""Every DiHAL stage as a Python function over a configuration dataclass, above :mod:`dihal_fast.evaluate`.

Each stage is ``stage(Config, out) -> Report``: it checks and locks its run directory ``out``, writes plain
files there (JSON reports, PNG plots, safetensors checkpoints), resumes from what is already there, and
returns a :class:`~dihal_fast.pipeline.reports.StageReport` that reads like the JSON it wrote. The ``dihal``
command is a thin shell over these functions: its flags are generated from the same dataclasses
(:mod:`dihal_fast.common.options`), with the help text in each field's metadata.

    from dihal_fast.pipeline import LocateConfig, ReplaceConfig, locate, replace
    report = locate(LocateConfig(max_tokens=16384, repeats=5, sample_size=1000), "runs/locate")
    hybrid = replace(ReplaceConfig(from_locate="runs/locate"), "runs/replace").hybrid_dir
"""

from dihal_fast.pipeline.demo_stage import DemoBudgetConfig, DemoConfig, demo
from dihal_fast.pipeline.evaluate_stage import EvaluateConfig, evaluate
from dihal_fast.pipeline.generate_stage import GenerateConfig, generate
from dihal_fast.pipeline.locate_stage import LocateConfig, locate
from dihal_fast.pipeline.replace_stage import ReplaceConfig, replace
from dihal_fast.pipeline.reports import (
    DemoReport,
    EvaluateReport,
    GenerateReport,
    LocateReport,
    ReplaceReport,
    StageReport,
    SweepReport,
)
from dihal_fast.pipeline.sweep_stage import SweepBudgetConfig, SweepConfig, sweep

__all__ = [
    "DemoConfig",
    "DemoReport",
    "DemoBudgetConfig",
    "EvaluateConfig",
    "EvaluateReport",
    "GenerateConfig",
    "GenerateReport",
    "LocateConfig",
    "LocateReport",
    "ReplaceConfig",
    "ReplaceReport",
    "StageReport",
    "SweepConfig",
    "SweepReport",
    "SweepBudgetConfig",
    "demo",
    "evaluate",
    "generate",
    "locate",
    "replace",
    "sweep",
]
