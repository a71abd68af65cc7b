"""Small shared utilities: atomic file output, seeding, run directories."""
from dihal_fast.common.devices import resolve_device
from dihal_fast.common.io import atomic_write_bytes, atomic_write_json, read_json
from dihal_fast.common.seeding import seed_everything

__all__ = ["atomic_write_bytes", "atomic_write_json", "read_json", "resolve_device", "seed_everything"]
