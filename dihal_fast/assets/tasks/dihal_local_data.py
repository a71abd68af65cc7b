"""The shipped task files next to this module as ``datasets`` splits, for lm-evaluation-harness.

The task YAMLs name these functions as ``custom_dataset: !function dihal_local_data.<task>``, so the data
load from the installed package whatever the working directory, with no network and no dataset cache.
Rebuild the files with ``python -m dihal_fast.evaluate.task_data`` (see ``README.md`` here).
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _test_split(name: str):
    import datasets

    lines = (HERE / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
    return datasets.DatasetDict({"test": datasets.Dataset.from_list([json.loads(line) for line in lines])})


def lambada(**_metadata):
    """``dihal_lambada_local``: rows ``{context, target, source, offset}``."""
    return _test_split("dihal_lambada_local")


def cloze(**_metadata):
    """``dihal_cloze_local``: rows ``{context, choices, label, source, offset}``."""
    return _test_split("dihal_cloze_local")
