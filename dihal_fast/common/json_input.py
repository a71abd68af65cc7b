"""Every JSON the package reads from the user (a config, a manifest, a corpus line, a ``--device-map``) goes
through :func:`parse_json`, which bounds its nesting at :data:`MAX_JSON_DEPTH`: deeper text would raise
``RecursionError`` in the parser or in the code that walks it."""

from __future__ import annotations

import json
from typing import Any

from dihal_fast.errors import DihalValueError

MAX_JSON_DEPTH = 100  # nesting levels of arrays and objects; the package's own files use fewer than 10


def parse_json(text: str | bytes, what: str, hint: str = "") -> Any:
    """``text`` parsed as JSON; a :class:`DihalValueError` ``"{what} is not valid JSON (...){hint}"`` for text
    that is not JSON or not UTF-8, or nests deeper than :data:`MAX_JSON_DEPTH` levels."""
    try:
        data = json.loads(text)
    except RecursionError as exc:
        raise DihalValueError(f"{what} is not valid JSON (nested deeper than {MAX_JSON_DEPTH} levels){hint}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DihalValueError(f"{what} is not valid JSON ({exc}){hint}") from exc
    if json_depth(data) > MAX_JSON_DEPTH:
        raise DihalValueError(f"{what} is not valid JSON (nested deeper than {MAX_JSON_DEPTH} levels){hint}")
    return data


def json_depth(data: Any) -> int:
    """How many levels of arrays and objects ``data`` nests (0 for a scalar), without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
