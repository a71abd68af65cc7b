"""One validation point per input: every field of a configuration dataclass is checked where it enters.

A config inherits :class:`CheckedConfig`; its ``__post_init__`` (or a subclass's, which calls
``super().__post_init__()`` first) runs :func:`check_fields`, so the ``dihal`` command (which builds the
config from its flags) and the Python API refuse the same values with the same one-line ``ValueError``
(``TypeError`` for a value of the wrong type) before any work starts; the message names the field by its
flag (``sample_size`` is ``--sample-size``). What is checked comes from the
field's annotation and the metadata of :func:`dihal_fast.common.options.option`:

- by type: ``int`` fields take integers (not bools, not ``1.5``) in ``0 .. 2^63 - 1``; ``float`` fields
  take finite real numbers; ``bool`` and ``str`` fields their own type; ``X | None`` also ``None``;
  ``list[X]`` / ``tuple[X, ...]`` each element as ``X``; a nested config must be an instance of its class;
- by metadata: ``min`` / ``max`` (inclusive), ``gt`` / ``lt`` (exclusive), ``choices``, ``finite=False``
  (a float that may be infinite), ``device=True`` (a torch device this machine has: see
  :func:`dihal_fast.common.devices.resolve_device`), ``device_map=True`` (a ``--device-map``: see
  :func:`dihal_fast.common.devices.parse_device_map`), ``path=True`` (a file or folder path: not the empty
  string, which would mean the current directory).

A config that no command builds from its flags (a derived or API-only one, such as the training loop's
``LoopSettings``) sets ``flag_names = False``: its messages name the field alone
(``grad_accum_steps must be >= 1, got 0``). Such fields are written with :func:`checked`.

Consistency between fields (``hidden`` a multiple of ``heads``) stays in the config's own
``__post_init__``, after the per-field checks.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from typing import Any, ClassVar

from dihal_fast.common.serial import SerialConfig
from dihal_fast.errors import DihalTypeError, DihalValueError

INT_LIMIT = 2**63 - 1  # what torch, NumPy and the C++ kernels take as an integer


class CheckedConfig(SerialConfig):
    """Mixin of the configuration dataclasses: ``__post_init__`` checks every field (see the module doc); the
    (de)serialisation comes from :class:`~dihal_fast.common.serial.SerialConfig`."""

    flag_names: ClassVar[bool] = True  # messages name the field's --flag (False: the field alone)

    def __post_init__(self) -> None:
        check_fields(self)


def checked(default: Any = dataclasses.MISSING, **constraints: Any) -> Any:
    """A dataclass field with the constraints of the module doc but no command-line help (a config of
    ``flag_names = False``)."""
    return dataclasses.field(default=default, metadata=constraints)


def check_fields(config: Any) -> None:
    """Check every init field of the dataclass instance ``config`` against its annotation and metadata."""
    hints = _hints(type(config))
    by_flag = getattr(config, "flag_names", True)
    for spec in dataclasses.fields(config):
        if spec.init:
            check_value(spec.name, getattr(config, spec.name), hints[spec.name], spec.metadata, by_flag)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of ``cls`` (computed once per class)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def field_flag(name: str, metadata: typing.Mapping[str, Any]) -> str:
    """The option a field is given by on the command line: its ``flag`` (the first, of several), else
    ``--field-name``; a positional field's own name."""
    if metadata.get("positional"):
        return name
    flag = metadata.get("flag", "--" + name.replace("_", "-"))
    return flag if isinstance(flag, str) else flag[0]


def check_value(
    name: str,
    value: Any,
    hint: Any,
    metadata: typing.Mapping[str, Any] = types.MappingProxyType({}),
    by_flag: bool = True,
) -> None:
    """``value`` of field ``name`` against the annotation ``hint`` and the constraints in ``metadata``; the error
    names the flag and the field (``--n-samples must be >= 1, got 0 (n_samples)``), or the field alone when not
    ``by_flag``."""
    if not by_flag:
        _check_value(name, value, hint, metadata)
        return
    try:
        _check_value(field_flag(name, metadata), value, hint, metadata)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{exc} ({name})") from None


def _check_value(where: str, value: Any, hint: Any, metadata: typing.Mapping[str, Any]) -> None:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return
        hint = next(arg for arg in args if arg is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise DihalTypeError(f"{where} must be a list, got {value!r}")
        elements = args[:1] * len(value) if origin is list or (len(args) == 2 and args[1] is Ellipsis) else args
        if len(elements) != len(value):
            raise DihalValueError(f"{where} must have {len(elements)} values, got {value!r}")
        for element, kind in zip(value, elements):
            _check_scalar(where, element, kind, metadata)
        return
    _check_scalar(where, value, hint, metadata)


def _check_scalar(where: str, value: Any, hint: Any, metadata: typing.Mapping[str, Any]) -> None:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, hint):
            raise DihalTypeError(f"{where} must be a {hint.__name__}, got {value!r}")
        return
    if hint is bool:
        if not isinstance(value, bool):
            raise DihalTypeError(f"{where} must be true or false, got {value!r}")
        return
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise DihalTypeError(f"{where} must be an integer, got {value!r}")
        _check_range(where, int(value), metadata, default_min=0, default_max=INT_LIMIT)
    elif hint is float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise DihalTypeError(f"{where} must be a number, got {value!r}")
        if math.isnan(value) or (metadata.get("finite", True) and math.isinf(value)):
            raise DihalValueError(f"{where} must be a finite number, got {value!r}")
        _check_range(where, float(value), metadata)
    elif hint is str and not isinstance(value, str):
        raise DihalTypeError(f"{where} must be a string, got {value!r}")
    if metadata.get("path") and isinstance(value, str) and not value.strip():
        raise DihalValueError(f"{where} must be a path, got the empty string {value!r}")
    if "choices" in metadata and value not in metadata["choices"]:
        raise DihalValueError(f"{where} must be one of {', '.join(map(str, metadata['choices']))}; got {value!r}")
    if metadata.get("device"):
        from dihal_fast.common.devices import resolve_device

        resolve_device(value)
    if metadata.get("device_map"):
        from dihal_fast.common.devices import parse_device_map

        parse_device_map(value)


def _check_range(
    where: str,
    value: float,
    metadata: typing.Mapping[str, Any],
    default_min: float | None = None,
    default_max: float | None = None,
) -> None:
    low, high = metadata.get("min", default_min), metadata.get("max", default_max)
    if low is not None and value < low:
        raise DihalValueError(f"{where} must be >= {low}, got {value!r}")
    if high is not None and value > high:
        raise DihalValueError(f"{where} must be <= {high}, got {value!r}")
    if "gt" in metadata and not value > metadata["gt"]:
        raise DihalValueError(f"{where} must be > {metadata['gt']}, got {value!r}")
    if "lt" in metadata and not value < metadata["lt"]:
        raise DihalValueError(f"{where} must be < {metadata['lt']}, got {value!r}")
