"""The ``dihal`` command line: one entry point, one sub-command module per stage.

Each module in :data:`COMMANDS` defines ``register(subparsers)``, which adds its sub-command
with a ``func(args) -> int`` default. User errors (bad paths, bad values) are reported as one
clear line on stderr with exit status 2, never as a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from dihal_fast._version import __version__
from dihal_fast.cpu_threads import configure_openmp, govern_threads

configure_openmp()  # the command's own process, before torch or the compiled core loads libgomp

# Sub-command modules, in the order they appear in --help.
COMMANDS = ["info", "backbone", "generate", "locate", "replace", "hcdlm", "evaluate", "sweep", "demo"]


class UserError(Exception):
    """A problem with the user's input: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dihal",
        description="Geometry-guided diffusion inside pretrained language models (DiHAL) and HC-DLM.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dihal_fast {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"dihal_fast.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    from dihal_fast.common.progress import quiet_library_bars

    quiet_library_bars()
    threads = govern_threads()  # measures the other processes' load while the command loads
    parser = build_parser()
    args = parser.parse_args(argv)
    threads.poll()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        return int(args.func(args) or 0)
    except (UserError, FileNotFoundError, ValueError, TypeError) as exc:
        print(f"dihal {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dihal {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
