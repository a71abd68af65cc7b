"""JSON round trips of config dataclasses with a clear error for keys the dataclass does not have."""

from __future__ import annotations

from dataclasses import MISSING, asdict, fields
from typing import TypeVar

T = TypeVar("T", bound="DictConfig")


class DictConfig:
    """Mixin for dataclasses: ``to_dict()`` and a checked ``from_dict()``."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls: type[T], data: dict) -> T:
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__} must be read from a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} keys {unknown}; expected a subset of {sorted(known)}")
        required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        missing = sorted(required - set(data))
        if missing:
            raise ValueError(f"{cls.__name__} lacks the keys {missing}")
        return cls(**data)
