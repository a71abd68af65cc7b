"""Running the other stages (``dihal locate`` through its command line, bridge training through
``dihal_fast.train.train_bridge``), reusing whatever a run directory already holds so that
``dihal sweep`` and ``dihal demo`` resume."""
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


def ensure_replace(out: Path, model: str | Path | None, layer: int, corpus: list[str], config) -> dict:
    """``train_bridge``'s summary (``bridge_loss``, ``hybrid_dir``, ...) for ``layer`` in ``out``: read from
    ``out/result.json`` when the run finished, else trained (resuming from its latest checkpoint)."""
    from dihal_fast.train.loop import train_bridge

    result = out / "result.json"
    if result.is_file():
        logger.info("reusing the finished bridge training in %s", out)
        return read_json(result, "bridge training summary")
    logger.info("replace: training a bridge for layer %d in %s (%d steps)", layer, out, config.steps)
    return train_bridge(model, layer, corpus[0] if len(corpus) == 1 else corpus, out, config, resume=True)
