"""Tiny randomly initialised causal-LM checkpoints (Llama, Qwen3, GPT-2, Mistral; also Qwen2, Gemma, Gemma2,
Phi3, GPT-NeoX) with a real tokenizer.

They load with ``AutoModelForCausalLM.from_pretrained(dir)`` / ``AutoTokenizer.from_pretrained(dir)``
offline, like any user checkpoint, so tests exercise the real loading path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dihal_fast.common.deepspeed_banner import without_deepspeed_banner
from dihal_fast.errors import DihalValueError

FAMILIES = ("llama", "qwen3", "gpt2", "mistral")  # the session fixture's set
MORE_FAMILIES = ("qwen2", "gemma", "gemma2", "phi3", "gpt_neox")

# The smallest HC-DLM the tests train: its model fields, and the same as `dihal hcdlm train` flags (with a batch of 8
# on one thread).
HCDLM_TINY = {
    "hidden": 32,
    "heads": 2,
    "encoder_blocks": 1,
    "denoiser_blocks": 1,
    "predictor_blocks": 1,
    "latent_dim": 8,
}
HCDLM_TINY_ARGS = [
    *(arg for name, value in HCDLM_TINY.items() for arg in (f"--{name.replace('_', '-')}", str(value))),
    *("--batch-size", "8", "--threads", "1"),
]


def hcdlm_tiny_config(steps: int = 2, *, model: dict | None = None, objective: dict | None = None, **train: Any):
    """The :class:`~dihal_fast.hcdlm.config.RunConfig` of the smallest HC-DLM run the tests train: 4x4 Sudoku from
    a pool of 30 puzzles, the :data:`HCDLM_TINY` model (``model`` fields added, e.g. ``kind``), batch 8, a
    checkpoint at the end; ``objective`` and ``train`` fields change the rest."""
    from dihal_fast.hcdlm.config import HCDLMModelConfig, HCDLMTrainConfig, ObjectiveConfig, RunConfig
    from dihal_fast.tasks.registry import TaskConfig

    return RunConfig(
        task=TaskConfig("sudoku", sudoku_box="2x2", sudoku_pool=30),
        model=HCDLMModelConfig(**{**HCDLM_TINY, **(model or {})}),
        objective=ObjectiveConfig(**(objective or {})),
        train=HCDLMTrainConfig(**{"steps": steps, "batch_size": 8, "checkpoint_every": steps, **train}),
    )


def hcdlm_text_args(text: str | Path, backbone: str | Path, max_chars: int = 20000, text_len: int = 16) -> list[str]:
    """The `dihal hcdlm train --task text` flags of a test: a short slice of ``text`` in windows of ``text_len``
    tokens of ``backbone``'s tokenizer."""
    return [
        "--text-files",
        str(text),
        "--text-max-chars",
        str(max_chars),
        "--text-len",
        str(text_len),
        "--backbone",
        str(backbone),
    ]


_TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a little girl who loved to read books.",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune.",
    "Numbers like 12, 345 and 6789 appear in text too; so do symbols: #, $, %, &.",
]


# A chat template of the Llama-3 / Gemma shape (turn markers around each message): what an instruct tokenizer carries.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|turn|>{{ m['role'] }}\n{{ m['content'] }}<|end_turn|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|turn|>assistant\n{% endif %}"
)


def make_tiny_tokenizer(vocab_size: int = 384, convention: str = "plain"):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with bos/eos/pad tokens, trained on a few lines.

    ``convention``: ``plain`` (``tokenizer(text)`` adds nothing: GPT-2, Qwen, SmolLM2, the shipped backbones),
    ``bos`` (it adds ``<s>``: Gemma, Llama 3) or ``chat`` (``bos`` plus turn tokens and a :data:`CHAT_TEMPLATE`,
    as an instruct model's tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if convention not in ("plain", "bos", "chat"):
        raise DihalValueError(f"convention must be plain, bos or chat, got {convention!r}")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TRAINING_TEXT * 4, trainer=trainer)
    if convention != "plain":
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    if convention == "chat":
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|turn|>", "<|end_turn|>"]})
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_tiny_checkpoint(
    out_dir: str | Path,
    family: str = "llama",
    n_layers: int = 4,
    hidden: int = 32,
    heads: int = 4,
    seed: int = 0,
    vocab_size: int = 384,
    max_positions: int = 128,
    convention: str = "plain",
) -> Path:
    """Write a tiny random ``family`` checkpoint with its tokenizer (``convention``: :func:`make_tiny_tokenizer`)
    to ``out_dir`` and return the path."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        Gemma2Config,
        GemmaConfig,
        GPT2Config,
        GPTNeoXConfig,
        LlamaConfig,
        MistralConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
    )

    if family not in FAMILIES + MORE_FAMILIES:
        raise DihalValueError(f"family must be one of {FAMILIES + MORE_FAMILIES}, got {family!r}")
    tokenizer = make_tiny_tokenizer(vocab_size, convention)
    vocab = len(tokenizer)
    ids = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        **ids,
    )
    if family == "llama":
        config = LlamaConfig(**common)
    elif family == "mistral":
        config = MistralConfig(**common)
    elif family == "qwen3":
        config = Qwen3Config(**common, head_dim=hidden // heads)
    elif family in ("qwen2", "phi3"):
        config = (Qwen2Config if family == "qwen2" else Phi3Config)(**common)
    elif family in ("gemma", "gemma2"):
        config = (GemmaConfig if family == "gemma" else Gemma2Config)(**common, head_dim=hidden // heads)
    elif family == "gpt_neox":
        config = GPTNeoXConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            max_position_embeddings=max_positions,
            **ids,
        )
    else:
        config = GPT2Config(
            vocab_size=vocab, n_embd=hidden, n_layer=n_layers, n_head=heads, n_positions=max_positions, **ids
        )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    out = Path(out_dir)
    with without_deepspeed_banner():
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
