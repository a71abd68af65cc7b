"""HC-DLM: a hierarchical continuous diffusion LM (continuous latent carried across steps, a token
scaffold read out of it at every step), with MDM, Latent DM, CCDD and AR baselines in the same harness.

Entry points: :func:`train` (a run directory from a :class:`RunConfig`), :func:`evaluate_run` and
:func:`solve_puzzle` (what ``dihal hcdlm eval`` / ``solve`` do, over an :class:`HCDLMEvalConfig` /
:class:`HCDLMSolveConfig`), :func:`load_run` +
:func:`evaluate_examples` / :func:`evaluate_text` / :func:`readout_by_step`, and the ``dihal hcdlm`` command.
:func:`task_defaults` gives the fields whose command-line default depends on the task (9x9 Sudoku's own), for a
:class:`RunConfig` built in Python to match ``dihal hcdlm train``.
"""

from dihal_fast.hcdlm.api import Solution, evaluate_run, solve_puzzle
from dihal_fast.hcdlm.config import (
    HCDLMModelConfig,
    HCDLMTrainConfig,
    ObjectiveConfig,
    RunConfig,
    SampleConfig,
    task_defaults,
)
from dihal_fast.hcdlm.eval_config import HCDLMEvalConfig, HCDLMSolveConfig, ReadoutConfig
from dihal_fast.hcdlm.scoring import accuracy_vs_steps, evaluate_examples, evaluate_text, load_run, readout_by_step
from dihal_fast.hcdlm.trainer import train

__all__ = [
    "HCDLMEvalConfig",
    "HCDLMModelConfig",
    "HCDLMSolveConfig",
    "HCDLMTrainConfig",
    "ObjectiveConfig",
    "ReadoutConfig",
    "RunConfig",
    "SampleConfig",
    "Solution",
    "accuracy_vs_steps",
    "evaluate_examples",
    "evaluate_run",
    "evaluate_text",
    "load_run",
    "readout_by_step",
    "solve_puzzle",
    "task_defaults",
    "train",
]
