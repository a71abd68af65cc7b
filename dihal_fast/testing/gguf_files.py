"""Tiny GGUF files for the tests, written with the gguf package's writer (needs ``dihal_fast[gguf]``).

:func:`llama_to_gguf` lays a tiny Llama checkpoint (:func:`~dihal_fast.testing.tiny.make_tiny_checkpoint`) out the
way llama.cpp's converter does (tensor names, query/key rows permuted for its rotary layout, norms in F32, the
byte-level BPE vocabulary and merges), so transformers' GGUF loader reads back the same model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """A query / key projection ``[heads * head_dim, hidden]`` with each head's rows interleaved as llama.cpp
    stores them (the inverse of the permutation transformers' loader undoes)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def _encoded(weight: np.ndarray, tensor_type: str):
    """``(data, raw_dtype)`` of a float32 weight stored as GGML type ``tensor_type``; ``I32`` writes integers, a
    type no dequantizer reads (for the refusal tests)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    qtype = GGMLQuantizationType[tensor_type]
    if qtype == GGMLQuantizationType.I32:
        return weight.astype(np.int32), None
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return quantize(weight, qtype), None
    return quantize(weight, qtype), qtype


def llama_to_gguf(
    checkpoint: str | Path, out: str | Path, tensor_type: str = "F32", architecture: str = "llama"
) -> Path:
    """Write the Llama checkpoint directory ``checkpoint`` as GGUF file ``out``: its 2-D weights in GGML type
    ``tensor_type`` (``F32``, ``F16``, ``Q8_0``, ...; rows a multiple of the type's block), norms in F32, its
    tokenizer as a ``gpt2`` vocabulary; ``architecture`` names another in the header (a refusal test's
    non-causal ``t5``). Returns ``out``."""
    import gguf
    from safetensors.numpy import load_file

    checkpoint, out = Path(checkpoint), Path(out)
    config = json.loads((checkpoint / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    writer = gguf.GGUFWriter(out, architecture)
    writer.add_name("tiny-llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base((config.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    _add_tokenizer(writer, checkpoint, config)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config["num_hidden_layers"])
    for name, weight in load_file(checkpoint / "model.safetensors").items():
        weight = weight.astype(np.float32)
        if name.endswith("q_proj.weight"):
            weight = _rotary_rows(weight, heads)
        elif name.endswith("k_proj.weight"):
            weight = _rotary_rows(weight, kv_heads)
        data, raw_dtype = _encoded(weight, tensor_type) if weight.ndim == 2 else (weight, None)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _add_tokenizer(writer, checkpoint: Path, config: dict) -> None:
    """The checkpoint's byte-level BPE tokenizer (``tokenizer.json``) as GGUF ``gpt2`` tokenizer metadata."""
    model = json.loads((checkpoint / "tokenizer.json").read_text())
    vocab = {**model["model"]["vocab"], **{token["content"]: token["id"] for token in model["added_tokens"]}}
    tokens = sorted(vocab, key=vocab.__getitem__)
    special = {token["content"] for token in model["added_tokens"] if token["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in special else 1 for token in tokens])  # 3: control, 1: normal
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["model"]["merges"]])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
