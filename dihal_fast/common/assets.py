"""Where the shipped backbone checkpoints and the default corpus lie inside the installed package, and
the names that select a shipped backbone (``--model tiny-qwen3-16l``).

A leaf module so that model loading (:mod:`dihal_fast.common.hf_loading`) can default to the shipped
backbone without importing :mod:`dihal_fast.backbone`, which builds on ``common``; the documented
names are re-exported by :mod:`dihal_fast.backbone`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dihal_fast.common.options import option
from dihal_fast.errors import DihalValueError

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_CORPUS = ASSETS_DIR / "corpus" / "default.txt"
# DeepSpeed configs shipped with the package (dihal_fast/assets/examples in the repository; `dihal info --examples`).
EXAMPLES_DIR = ASSETS_DIR / "examples"


@dataclass(frozen=True)
class ShippedBackbone:
    """A causal LM that ships inside the package (``from_pretrained`` layout in ``directory``)."""

    name: str
    directory: Path
    family: str
    description: str


SHIPPED_BACKBONES = {
    backbone.name: backbone
    for backbone in (
        ShippedBackbone(
            "tiny-llama-8l",
            ASSETS_DIR / "backbone",
            "llama",
            "LlamaForCausalLM, 8 layers, hidden 128, tied embeddings (the default)",
        ),
        ShippedBackbone(
            "tiny-qwen3-16l",
            ASSETS_DIR / "backbone_qwen3",
            "qwen3",
            "Qwen3ForCausalLM, 16 layers, hidden 96, QK-norm, 4 query / 2 key-value heads, untied head",
        ),
    )
}
DEFAULT_BACKBONE = "tiny-llama-8l"
DEFAULT_MODEL_DIR = SHIPPED_BACKBONES[DEFAULT_BACKBONE].directory


def shipped_model_dir(name: str) -> Path:
    """Directory of the shipped backbone ``name`` (a key of :data:`SHIPPED_BACKBONES`)."""
    if name not in SHIPPED_BACKBONES:
        raise DihalValueError(f"unknown shipped backbone {name!r}; shipped: {', '.join(SHIPPED_BACKBONES)}")
    directory = SHIPPED_BACKBONES[name].directory
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"the shipped backbone {name} is missing from {directory}; reinstall dihal_fast "
            "or pass --model DIR with a local Hugging Face causal-LM checkpoint"
        )
    return directory


def default_model_dir() -> Path:
    """Directory of the default shipped backbone (``from_pretrained`` layout)."""
    return shipped_model_dir(DEFAULT_BACKBONE)


def model_location(model: str | os.PathLike | None) -> Path:
    """Where ``--model`` points: ``None`` = the default backbone; an existing path is that path (a local
    directory wins over a shipped backbone of the same name); else a shipped backbone's name; else an error
    line naming the shipped backbones."""
    if model is None:
        return default_model_dir()
    path = Path(model)
    if path.exists():
        return path
    if str(model) in SHIPPED_BACKBONES:
        return shipped_model_dir(str(model))
    raise FileNotFoundError(
        f"no checkpoint at {path}: the model directory does not exist, nor is {str(model)!r} a "
        f"shipped backbone ({', '.join(SHIPPED_BACKBONES)}; see `dihal backbone list`)"
    )


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


def backbone_option(default_note: str = "") -> Any:
    """The ``model`` field of a stage config that loads a backbone (``--model``): a shipped name or a local
    checkpoint, None meaning the default backbone (``default_note`` adds what else None may mean)."""
    return option(
        None,
        "shipped backbone name (dihal backbone list) or local Hugging Face causal-LM checkpoint directory "
        f"(default: {DEFAULT_BACKBONE}{default_note})",
        metavar="MODEL",
        path=True,
    )


def corpus_option(default_note: str = "") -> Any:
    """The ``corpus`` field of a stage config (``--corpus``), None meaning the shipped corpus (``default_note`` adds
    what else None may mean)."""
    return option(
        None,
        f".txt / .jsonl files, directories of them or a saved dataset (default: the shipped corpus{default_note})",
        metavar="PATH",
        path=True,
    )
