"""The package's one error base: a refusal of the user's input or environment.

The ``dihal`` command prints a :class:`DihalError` as one line (exit status 2; 1 for the environment) and lets
any other exception show as the bug it is, with its traceback. The subclasses keep the built-in type a caller
of the public API already catches (``except ValueError`` still works).
"""

from __future__ import annotations


class DihalError(Exception):
    """A refusal of the user's input (a path, a value, a file's contents) or of the environment."""


class DihalValueError(DihalError, ValueError):
    """A value, file or configuration the package refuses: bad range, bad contents, inconsistent settings."""


class DihalTypeError(DihalError, TypeError):
    """An argument of the wrong type (a string where a number belongs, a bool where a seed belongs)."""


class DihalIOError(DihalError, OSError):
    """A read or write the environment refused (no space, no permission, a vanished directory), naming the path."""
