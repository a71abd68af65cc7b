"""Deprecated path of :mod:`dihal_fast.common.metrics` (the 0.1 and 0.2 README named it; removed in 0.4).

Every name is looked up in :mod:`dihal_fast.common.metrics`, so both paths give the same objects.
"""

import warnings

from dihal_fast.common import metrics as _metrics

warnings.warn(
    "dihal_fast.evaluate.metrics is deprecated; import dihal_fast.common.metrics",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str):
    return getattr(_metrics, name)
