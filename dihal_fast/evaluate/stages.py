"""Running the other stages (locate, replace) through their public command-line interface, reusing
whatever a run directory already holds so that ``dihal sweep`` and ``dihal demo`` resume."""
from __future__ import annotations

import logging
from pathlib import Path

from dihal_fast.common import read_json

logger = logging.getLogger(__name__)


def run_stage(argv: list[str]) -> int:
    """Run ``dihal <argv>`` in this process; exceptions propagate (unlike ``main``, which prints them)."""
    from dihal_fast.cli import build_parser

    args = build_parser().parse_args([str(a) for a in argv])
    code = int(args.func(args) or 0)
    if code != 0:
        raise RuntimeError(f"`dihal {' '.join(map(str, argv))}` stopped with exit status {code}")
    return code


def ensure_locate(out: Path, model: str | Path | None, corpus: list[str], options: list[str]) -> dict:
    """``out/locate.json``, computed by ``dihal locate`` unless present (a checkpointed collection resumes)."""
    report = out / "locate.json"
    if report.is_file():
        logger.info("reusing %s", report)
        return read_json(report, "locate report")
    argv = ["locate", "--out", out, "--corpus", *corpus, *options]
    if model is not None:
        argv += ["--model", model]
    if (out / "collect" / "config.json").is_file():
        argv.append("--resume")
    logger.info("locate: dihal %s", " ".join(map(str, argv)))
    run_stage(argv)
    return read_json(report, "locate report")


def ensure_replace(out: Path, model: str | Path | None, layer: int, corpus: list[str], steps: int,
                   options: list) -> Path:
    """The hybrid directory of ``dihal replace`` at ``layer`` in ``out``, trained unless already finished
    (an interrupted training resumes from its checkpoint)."""
    from dihal_fast.evaluate.hybrid_adapter import find_hybrid_dir

    found = find_hybrid_dir(out)
    if found is not None:
        logger.info("reusing the hybrid in %s", found)
        return found
    argv = ["replace", "--layer", layer, "--corpus", *corpus, "--out", out, "--steps", steps, *options]
    if model is not None:
        argv += ["--model", model]
    if out.is_dir() and any(out.iterdir()):
        argv.append("--resume")
    logger.info("replace: dihal %s", " ".join(map(str, argv)))
    run_stage(argv)
    found = find_hybrid_dir(out)
    if found is None:
        raise RuntimeError(f"`dihal replace` finished but {out} holds no hybrid (hybrid_config.json)")
    return found
