"""Command-line options generated from a stage's configuration dataclass.

Each field carries its help text in ``metadata["help"]`` (write fields with :func:`option`);
:func:`add_dataclass_options` turns the fields into ``--flags`` and :func:`dataclass_from_options`
builds the configuration back from the parsed arguments, so the ``dihal`` command and the Python API
cannot drift apart. A field becomes:

- ``sample_size: int`` -> ``--sample-size N`` (``int``, ``float``, ``str``; ``X | None`` too);
- ``keep_first: bool`` -> ``--keep-first`` / ``--no-keep-first``;
- ``layers: list[int] | None`` -> ``--layers L [L ...]`` (with ``action="append"``: a repeatable flag);
- a field without a default -> a required flag;
- a nested dataclass -> the flags of its own fields (flattened), built back into the nested object;
  ``metadata["options"] = (add, build)`` hands a nested config to its own flag functions instead;
- ``bridge: dict`` with ``metadata["overrides"] = (BridgeConfig, {"width": {"help": ...}, ...})`` -> prefixed
  flags ``--bridge-width``, ... for the named fields of that dataclass (its defaults, the given help and
  ``choices``), built back into the dict of the values that differ from those defaults.

``metadata`` may also give ``choices``, ``metavar`` and:

- ``flag``: the option string(s) instead of ``--field-name`` (a tuple: the first is the name shown, the
  others are aliases, e.g. an older spelling); the parsed value keeps the field's name as ``dest``;
- ``type``: a function that parses the whole value (e.g. ``"3,4"`` -> ``[3, 4]``), instead of the field's
  type (for a list field: one argument instead of ``nargs="+"``);
- ``cli_default``: the flag's default when it is not the field's, typically ``None`` for "the command
  decides" (the help text says what, and the command resolves it before building the config);
- ``required``: whether the flag must be given, when that is not what the field's default says;
- ``positional``: a positional argument (named by the field) instead of a flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

MISSING = dataclasses.MISSING


def option(default: Any = MISSING, help: str = "", *, default_factory: Any = MISSING, **metadata: Any) -> Any:
    """A dataclass field with its command-line help (``default`` and ``default_factory`` omitted: a required
    option); ``metadata`` holds the keys listed in the module docstring."""
    if not help:  # a mistake in the package's own config classes, not the user's input
        raise ValueError("every option needs a help text")
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"help": help, **metadata})


def comma_integers(text: str) -> list[int]:
    """``"3,4"`` -> ``[3, 4]`` (a ``metadata["type"]`` for list fields written with commas; ``""`` -> ``[]``)."""
    try:
        return [int(value) for value in text.split(",") if value.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


def comma_floats(text: str) -> list[float]:
    """``"0.05,0.5"`` -> ``[0.05, 0.5]`` (as :func:`comma_integers`, for real numbers)."""
    try:
        return [float(value) for value in text.split(",") if value.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from exc


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except ``None`` ones (their help says what unset means) and those of required flags."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.required:
            return action.help
        return super()._get_help_string(action)


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """``(element type, is a list)`` of an annotation, with ``| None`` removed."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    if typing.get_origin(hint) is list:
        return typing.get_args(hint)[0], True
    return hint, False


def _default(spec: dataclasses.Field, defaults: Any) -> Any:
    if defaults is not None:
        return getattr(defaults, spec.name)
    if spec.default_factory is not MISSING:
        return spec.default_factory()
    return None if spec.default is MISSING else spec.default


def add_dataclass_options(
    parser: argparse.ArgumentParser, cls: type, exclude: tuple[str, ...] = (), defaults: Any = None
) -> None:
    """Add a flag for every init field of dataclass ``cls`` (except ``exclude``); ``defaults`` is an
    instance whose values replace the field defaults (used for nested configurations)."""
    hints = typing.get_type_hints(cls)
    for spec in dataclasses.fields(cls):
        if not spec.init or spec.name in exclude:
            continue
        kind, many = _unwrap(hints[spec.name])
        default = _default(spec, defaults)
        if "options" in spec.metadata:
            spec.metadata["options"][0](parser)
            continue
        if "overrides" in spec.metadata:
            _add_override_options(parser, spec.name, *spec.metadata["overrides"])
            continue
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            add_dataclass_options(parser, kind, defaults=default)
            continue
        if spec.metadata.get("positional"):
            parser.add_argument(spec.name, type=spec.metadata.get("type", kind), help=spec.metadata["help"])
            continue
        flags = spec.metadata.get("flag", "--" + spec.name.replace("_", "-"))
        flags = (flags,) if isinstance(flags, str) else tuple(flags)
        if "cli_default" in spec.metadata:
            default = spec.metadata["cli_default"]
        extra = {key: spec.metadata[key] for key in ("choices", "metavar") if key in spec.metadata}
        if "flag" in spec.metadata and "choices" not in extra:
            extra.setdefault("metavar", flags[0].lstrip("-").replace("-", "_").upper())
        required = spec.metadata.get(
            "required", defaults is None and spec.default is MISSING and spec.default_factory is MISSING
        )
        if kind is bool:
            extra.pop("metavar", None)
            parser.add_argument(
                *flags,
                dest=spec.name,
                action=argparse.BooleanOptionalAction,
                default=default,
                required=required,
                help=spec.metadata["help"],
            )
            continue
        if "type" in spec.metadata:
            kind = spec.metadata["type"]
        elif many and spec.metadata.get("action") == "append":
            extra["action"] = "append"
        elif many:
            extra["nargs"] = "+"
        parser.add_argument(
            *flags, dest=spec.name, type=kind, default=default, required=required, help=spec.metadata["help"], **extra
        )


def _add_override_options(
    parser: argparse.ArgumentParser, prefix: str, target: type, specs: dict[str, dict[str, Any]]
) -> None:
    """``--{prefix}-{name}`` for each field ``name`` of dataclass ``target`` in ``specs`` (its help, choices)."""
    defaults = {f.name: f.default for f in dataclasses.fields(target)}
    for name, spec in specs.items():
        kind = type(defaults[name])
        parser.add_argument(
            f"--{prefix}-{name.replace('_', '-')}",
            dest=f"{prefix}_{name}",
            default=defaults[name],
            **({"action": argparse.BooleanOptionalAction} if kind is bool else {"type": kind}),
            **spec,
        )


def _override_values(args: argparse.Namespace, prefix: str, target: type, specs: dict[str, Any]) -> dict[str, Any]:
    """The values of :func:`_add_override_options`' flags that differ from ``target``'s defaults."""
    defaults = {f.name: f.default for f in dataclasses.fields(target)}
    values = {name: getattr(args, f"{prefix}_{name}") for name in specs}
    return {name: value for name, value in values.items() if value != defaults[name]}


def dataclass_from_options(cls: type, args: argparse.Namespace, **given: Any) -> Any:
    """The ``cls`` instance that the flags of :func:`add_dataclass_options` describe; ``given`` fields
    are taken as they are instead of from ``args``."""
    hints = typing.get_type_hints(cls)
    values = dict(given)
    for spec in dataclasses.fields(cls):
        if not spec.init or spec.name in values:
            continue
        kind = _unwrap(hints[spec.name])[0]
        if "options" in spec.metadata:
            values[spec.name] = spec.metadata["options"][1](args)
        elif "overrides" in spec.metadata:
            values[spec.name] = _override_values(args, spec.name, *spec.metadata["overrides"])
        elif isinstance(kind, type) and dataclasses.is_dataclass(kind):
            values[spec.name] = dataclass_from_options(kind, args)
        else:
            values[spec.name] = getattr(args, spec.name)
    return cls(**values)
