"""Tasks for the HC-DLM harness: Sudoku (solver, grader, generator), Countdown (checkers, solver,
generator) and unconditional text, each exposed to models as a fixed-size token interface."""

from dihal_fast.tasks.base import EvalExample, Task, TaskSpec
from dihal_fast.tasks.registry import TaskConfig, build_task

__all__ = ["EvalExample", "Task", "TaskConfig", "TaskSpec", "build_task"]
