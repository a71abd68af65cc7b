"""Leaf utilities that every other part of the package may use and that import no other part of it:
atomic file output, run directories, seeding, devices, progress, float64 sampling (``sampling``), metrics
(``metrics``), model and tokenizer loading (``models``), shipped-asset paths (``assets``) and
dataclass-generated command-line options (``options``)."""

from dihal_fast.common.devices import resolve_device
from dihal_fast.common.io import atomic_write_bytes, atomic_write_json, read_json
from dihal_fast.common.seeding import seed_everything

__all__ = ["atomic_write_bytes", "atomic_write_json", "read_json", "resolve_device", "seed_everything"]
