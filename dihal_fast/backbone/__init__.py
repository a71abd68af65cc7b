"""The embedded default backbone: a small Llama-architecture causal LM shipped with the package.

``default_model_dir()`` is the shipped checkpoint (``from_pretrained`` layout); ``default_corpus()`` is a
small public-domain held-out English text used when a command gets no ``--corpus``.
``train_backbone`` / ``dihal backbone train`` produce such a checkpoint from plain UTF-8 text files.
"""
from __future__ import annotations

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


def train_backbone(*args, **kwargs):
    """See :func:`dihal_fast.backbone.train.train_backbone` (imported lazily: torch/transformers are heavy)."""
    from dihal_fast.backbone.train import train_backbone as _train

    return _train(*args, **kwargs)


__all__ = ["DEFAULT_CORPUS", "DEFAULT_MODEL_DIR", "default_corpus", "default_model_dir", "train_backbone"]
