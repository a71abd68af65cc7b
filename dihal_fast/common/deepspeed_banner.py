"""DeepSpeed's CPU banner kept out of saves that do not use DeepSpeed.

transformers' ``save_pretrained`` unwraps the model through accelerate, which imports DeepSpeed whenever it is
installed; the import logs "Setting accelerator to CPU ..." (a WARNING, on stdout) on a machine without a GPU,
although nothing uses DeepSpeed. The package's own saves drop that one record; every other DeepSpeed record, and
the banner anywhere else, is left alone.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

DEEPSPEED_BANNER = "Setting accelerator to CPU"
DEEPSPEED_LOGGER = "DeepSpeed"


class _DropBanner(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(DEEPSPEED_BANNER)


@contextlib.contextmanager
def without_deepspeed_banner() -> Iterator[None]:
    """Drop DeepSpeed's CPU banner while the block runs (a save that may import DeepSpeed for the first time)."""
    logger, banner = logging.getLogger(DEEPSPEED_LOGGER), _DropBanner()
    logger.addFilter(banner)
    try:
        yield
    finally:
        logger.removeFilter(banner)
