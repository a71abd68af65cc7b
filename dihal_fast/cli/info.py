"""``dihal info``: what this build can do (compiled backends, devices, thread counts)."""
from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "info",
        help="show the compiled backends and whether they can run here",
        description="Print dihal_fast.build_info() as JSON: version, compiled backends, devices.",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dihal_fast import build_info

    print(json.dumps(build_info(), indent=2))
    return 0
