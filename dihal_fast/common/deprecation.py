"""Old public names kept for one more minor version: a module ``__getattr__`` that warns, then hands over the
object under its new name (so both names give the same object)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

REMOVED_IN = "0.4"


def renamed_attributes(module: str, namespace: Mapping[str, Any], renamed: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``module`` that serves each old name in ``renamed`` (``{"Old": "New"}``) as
    ``namespace["New"]`` with a ``DeprecationWarning``; any other missing name is an ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        if name not in renamed:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} is deprecated and will be removed in {REMOVED_IN}; use {renamed[name]}",
            DeprecationWarning,
            stacklevel=2,
        )
        return namespace[renamed[name]]

    return __getattr__
