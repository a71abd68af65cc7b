"""The embedded default backbone: a small Llama-architecture causal LM shipped with the package.

``default_model_dir()`` is the shipped checkpoint (``from_pretrained`` layout); ``default_corpus()`` is a
small public-domain held-out English text used when a command gets no ``--corpus``.
``train_backbone`` / ``dihal backbone train`` produce such a checkpoint from plain UTF-8 text files.
"""

from __future__ import annotations

from dihal_fast.common.assets import ASSETS_DIR, DEFAULT_CORPUS, DEFAULT_MODEL_DIR, default_corpus, default_model_dir


def train_backbone(*args, **kwargs):
    """See :func:`dihal_fast.backbone.train.train_backbone` (imported lazily: torch/transformers are heavy)."""
    from dihal_fast.backbone.train import train_backbone as _train

    return _train(*args, **kwargs)


__all__ = ["ASSETS_DIR", "DEFAULT_CORPUS", "DEFAULT_MODEL_DIR", "default_corpus", "default_model_dir", "train_backbone"]
