"""``dihal info``: what this build can do (compiled backends, devices, thread counts)."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "info",
        help="show the compiled backends and whether they can run here",
        description="Print dihal_fast.build_info() as JSON: version, compiled backends, devices. With --examples, "
        "print the folder of the shipped DeepSpeed configs (ds_zero2.json, ds_zero2_bf16.json, ds_zero3.json) instead.",
    )
    parser.add_argument(
        "--examples",
        action="store_true",
        help="print the folder of the shipped example configs: --deepspeed $(dihal info --examples)/ds_zero2.json",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.examples:
        from dihal_fast.common.assets import EXAMPLES_DIR

        if not EXAMPLES_DIR.is_dir():
            raise FileNotFoundError(
                f"the shipped example configs are missing from {EXAMPLES_DIR}; reinstall dihal_fast"
            )
        print(EXAMPLES_DIR)
        return 0
    from dihal_fast import build_info

    print(json.dumps(build_info(), indent=2))
    return 0
