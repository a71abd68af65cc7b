"""Where the shipped backbone checkpoint and default corpus lie inside the installed package.

A leaf module so that model loading (:mod:`dihal_fast.common.models`) can default to the shipped
backbone without importing :mod:`dihal_fast.backbone`, which builds on ``common``; the documented
names are re-exported by :mod:`dihal_fast.backbone`.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_MODEL_DIR = ASSETS_DIR / "backbone"
DEFAULT_CORPUS = ASSETS_DIR / "corpus" / "default.txt"


def default_model_dir() -> Path:
    """Directory of the shipped backbone checkpoint (``from_pretrained`` layout)."""
    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        raise FileNotFoundError(
            f"the shipped backbone is missing from {DEFAULT_MODEL_DIR}; reinstall dihal_fast "
            "or pass --model DIR with a local Hugging Face causal-LM checkpoint"
        )
    return DEFAULT_MODEL_DIR


def default_corpus() -> Path:
    """The shipped default corpus: held-out Gutenberg book tails + 2003-2006 State of the Union text.

    None of it was used to train the shipped backbone (see ``dihal_fast/assets/corpus/README.md``).
    """
    if not DEFAULT_CORPUS.is_file():
        raise FileNotFoundError(
            f"the shipped default corpus is missing from {DEFAULT_CORPUS}; reinstall dihal_fast or pass --corpus PATH"
        )
    return DEFAULT_CORPUS


def corpus_or_default(corpus: Sequence[str | os.PathLike] | None) -> list[str]:
    """The corpus paths a stage was given, or the shipped corpus when none were."""
    if corpus:
        return [str(path) for path in corpus]
    return [str(default_corpus())]
