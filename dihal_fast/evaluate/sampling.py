"""Deprecated path of :mod:`dihal_fast.common.sampling` (the 0.1 and 0.2 README named it; removed in 0.4).

Every name is looked up in :mod:`dihal_fast.common.sampling`, so both paths give the same objects.
"""

import warnings

from dihal_fast.common import sampling as _sampling

warnings.warn(
    "dihal_fast.evaluate.sampling is deprecated; import dihal_fast.common.sampling",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str):
    return getattr(_sampling, name)
