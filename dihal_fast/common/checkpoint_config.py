"""A checkpoint's ``config.json`` checked where a stage starts, before any work.

transformers reads a wrong-typed shape field (``"num_hidden_layers": "four"``) only when the model is built,
with a multi-line validation error, and a Llama-style model takes a ``--seq-len`` beyond its
``max_position_embeddings`` silently (a hybrid refuses it only after loading everything).
:func:`check_checkpoint_config` turns both into one line naming the file, the field and the numbers; each stage
that takes ``--model`` (or a hybrid) calls it first.
"""

from __future__ import annotations

import os
from pathlib import Path

from dihal_fast.errors import DihalValueError

# Integer shape fields of the usual families (Llama/Qwen/Gemma/Phi names, GPT-2/NeoX names, the hybrid's own);
# absent or null fields are left to transformers' defaults.
SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "head_dim",
    "n_embd",
    "n_layer",
    "n_head",
    "n_inner",
    "layer",
    "backbone_layers",
)
# The context length, under its two usual names; 0 = no limit (a hybrid of a backbone without one).
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions")


def check_checkpoint_config(
    model: str | os.PathLike | None, seq_len: int | None = None, flag: str = "--seq-len"
) -> Path:
    """The checkpoint directory of ``model`` (:func:`~dihal_fast.common.hf_loading.resolve_model_dir`: a path, a
    shipped backbone's name or ``None``) after checking its ``config.json``: every shape field present is a whole
    number (>= 1; a context field >= 0), and ``seq_len`` (given with ``flag``) fits the context. ``ValueError``
    naming the file and the field otherwise."""
    from dihal_fast.common.hf_loading import resolve_model_dir
    from dihal_fast.common.io import read_json

    model_dir = resolve_model_dir(model)
    path = model_dir / "config.json"
    config = read_json(path, "model config")
    if not isinstance(config, dict):
        raise DihalValueError(f"{path} holds {type(config).__name__}, expected a JSON object of model settings")
    for name in SHAPE_FIELDS + CONTEXT_FIELDS:
        value, low = config.get(name), 0 if name in CONTEXT_FIELDS else 1
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise DihalValueError(f"{path}: field {name!r} is {value!r}, expected a whole number >= {low}")
    for name in CONTEXT_FIELDS:
        limit = config.get(name)
        if seq_len is not None and limit and seq_len > limit:
            raise DihalValueError(f"{flag} {seq_len} exceeds the model's {name} ({limit} positions, in {path})")
    return model_dir
