"""The backbone model: a ``LlamaForCausalLM`` or ``Qwen3ForCausalLM`` built from :class:`BackboneModelConfig`, and
precision choice (and its autocast)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from dihal_fast.backbone.config import BackboneModelConfig
from dihal_fast.errors import DihalValueError

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def build_model(cfg: BackboneModelConfig, tokenizer):
    """A randomly initialised ``LlamaForCausalLM`` or ``Qwen3ForCausalLM`` (``cfg.family``) matching ``tokenizer``."""
    import transformers

    if len(tokenizer) > cfg.vocab_size:
        raise DihalValueError(f"tokenizer has {len(tokenizer)} tokens, more than the model vocab size {cfg.vocab_size}")
    shape = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "max_position_embeddings": cfg.seq_len,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if cfg.head_dim or cfg.family == "qwen3":  # Qwen3Config's head_dim does not default to hidden / heads
        shape["head_dim"] = cfg.head_size
    if cfg.family == "qwen3":
        config = transformers.Qwen3Config(
            **shape, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta}
        )
    else:
        config = transformers.LlamaConfig(**shape, rope_theta=cfg.rope_theta)
    return getattr(transformers, ARCHITECTURES[cfg.family])(config)


def count_parameters(model) -> int:
    """Number of distinct parameters (tied embedding/LM-head weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def cpu_has_amx() -> bool:
    """Whether the CPU advertises AMX bf16 tiles (Linux ``/proc/cpuinfo``)."""
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.is_file() and "amx_bf16" in cpuinfo.read_text()


def resolve_precision(precision: str, device: str) -> str:
    """``auto`` -> bf16 autocast where bf16 matrix products are fast (CUDA, CPUs with AMX), else fp32.

    On CPUs with only AVX-512 (no AMX) bf16 GEMMs measured slower than fp32 here, so auto keeps fp32.
    """
    if precision != "auto":
        return precision
    return "bf16" if device.startswith("cuda") or cpu_has_amx() else "fp32"


def autocast_context(precision: str, device: str = "cpu"):
    """bf16 autocast on ``device`` for ``precision == "bf16"``, a no-op otherwise."""
    import torch

    if precision == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
