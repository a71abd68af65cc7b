"""The embedded default backbone: a small Llama-architecture causal LM shipped with the package."""
from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "backbone"


def default_model_dir() -> Path:
    """Directory of the shipped backbone checkpoint (``from_pretrained`` layout)."""
    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        raise FileNotFoundError(
            f"the shipped backbone is missing from {DEFAULT_MODEL_DIR}; reinstall dihal_fast "
            "or pass --model DIR with a local Hugging Face causal-LM checkpoint"
        )
    return DEFAULT_MODEL_DIR
