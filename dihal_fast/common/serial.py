"""The one (de)serialisation of the configuration dataclasses: dict and JSON round trips, keys renamed or
fields added since a run was saved, and the field-by-field differences a resume is refused on.

Every config inherits :class:`SerialConfig` (through :class:`~dihal_fast.common.validation.CheckedConfig`, or
directly for a config without declared constraints). A class declares its history in two class attributes:

- ``renamed = {"old_name": "new_name"}``: keys an earlier version saved under another name;
- ``legacy = {"field": value}``: fields added later, with the value runs saved without them used, so that an old
  run loads, and resumes (:meth:`SerialConfig.comparable_to`) when it is continued with that meaning.

Nested configs (a field whose type is a :class:`SerialConfig`) are saved as nested objects and read back
recursively, each with its own history.

Reading the JSON itself is :func:`dihal_fast.common.json_input.parse_json`'s (through ``io.read_json``).
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, TypeVar

from dihal_fast.errors import DihalError, DihalValueError

T = TypeVar("T", bound="SerialConfig")


class SerialConfig:
    """Mixin of the configuration dataclasses: ``to_dict`` / ``from_dict``, ``save`` / ``load``, the resume diff."""

    renamed: ClassVar[Mapping[str, str]] = {}
    legacy: ClassVar[Mapping[str, Any]] = {}

    def to_dict(self) -> dict:
        """The config as plain JSON-ready data (nested configs as nested dicts)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[T], data: object) -> T:
        """The config that ``data`` (what :meth:`to_dict` wrote, by this or an earlier version) describes;
        ``ValueError`` naming the class for anything else (not an object, unknown or missing keys)."""
        if not isinstance(data, dict):
            raise DihalValueError(f"{cls.__name__} must be read from a JSON object, got {type(data).__name__}")
        values = {cls.renamed.get(key, key): value for key, value in data.items()}
        specs = {spec.name: spec for spec in dataclasses.fields(cls) if spec.init}  # type: ignore[arg-type]
        unknown = sorted(set(values) - set(specs))
        if unknown:
            raise DihalValueError(f"unknown {cls.__name__} keys {unknown}; expected a subset of {sorted(specs)}")
        values = {**{k: v for k, v in cls.legacy.items() if k in specs}, **values}
        hints = typing.get_type_hints(cls)
        for name, value in values.items():
            nested = _config_type(hints[name])
            if nested is not None and not isinstance(value, nested) and value is not None:
                if not isinstance(value, dict):
                    raise DihalValueError(f"{cls.__name__} key {name!r} must be an object, got {type(value).__name__}")
                values[name] = nested.from_dict(value)
        required = {
            name
            for name, spec in specs.items()
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
        }
        missing = sorted(required - set(values))
        if missing:
            raise DihalValueError(f"{cls.__name__} lacks the keys {missing}")
        return cls(**values)

    def save(self, path: str | os.PathLike) -> None:
        """Write :meth:`to_dict` as JSON through the package's atomic writer."""
        from dihal_fast.common.io import atomic_write_json

        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls: type[T], path: str | os.PathLike) -> T:
        """The config saved in ``path``; ``ValueError`` naming the file when it is not one."""
        from dihal_fast.common.io import read_json

        data = read_json(path, f"{cls.__name__} file")
        try:
            return cls.from_dict(data)
        except DihalError as exc:  # a refusal by the config's own checks: name the file it came from
            raise DihalValueError(f"{path}: {exc}") from exc

    def comparable_to(self, saved: object) -> dict:
        """:meth:`to_dict`, less the fields that ``saved`` (a checkpoint's config) lacks and that hold their
        ``legacy`` value: what a resume compares, so that a run saved before a field existed resumes when it is
        continued with the meaning it was trained with (and only then)."""
        data = self.to_dict()
        if not isinstance(saved, dict):
            return data
        for spec in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, spec.name)
            if isinstance(value, SerialConfig) and isinstance(saved.get(spec.name), dict):
                data[spec.name] = value.comparable_to(saved[spec.name])
            elif spec.name in self.legacy and spec.name not in saved and data.get(spec.name) == self.legacy[spec.name]:
                data.pop(spec.name, None)
        return data

    def differences(self, saved: object, ignore: Iterable[str] = ()) -> list[str]:
        """``field: saved X, now Y`` for every field (nested ones as ``section.field``) where ``saved`` (a dict
        that :meth:`to_dict` wrote) differs from this config, except those named in ``ignore``."""
        return config_differences(saved, self.comparable_to(saved), ignore)


def config_differences(saved: object, current: Mapping[str, Any], ignore: Iterable[str] = ()) -> list[str]:
    """:meth:`SerialConfig.differences` of two plain dicts (``saved`` not a dict: every field differs)."""
    old = _flatten(saved) if isinstance(saved, dict) else {}
    new, skip = _flatten(current), set(ignore)
    return [
        f"{key}: saved {old.get(key)!r}, now {new.get(key)!r}"
        for key in sorted(set(old) | set(new))
        if key not in skip and key.split(".")[0] not in skip and old.get(key) != new.get(key)
    ]


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _config_type(hint: Any) -> type[SerialConfig] | None:
    """The :class:`SerialConfig` class an annotation names (``X`` or ``X | None``), else None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next((arg for arg in typing.get_args(hint) if arg is not type(None)), None)
    return hint if isinstance(hint, type) and issubclass(hint, SerialConfig) else None
