"""The special tokens of a tokenizer's documents, decided once from the tokenizer (:func:`token_convention`).

A document is ``prefix + text + suffix``: the prefix is what ``tokenizer(text)`` puts before a text (BOS for Gemma
and Llama 3; nothing for GPT-2, Qwen, SmolLM2 and the shipped backbones), the suffix what it puts after one, else
EOS, the document separator, where the tokenizer has one. A chat template is never applied to plain text. Every
stage that tokenises text goes through this: corpus blocks (locate, replace, evaluate, sweep), the start of a
sample or prompt, Gen PPL, the downstream tasks, and the decoding of samples (special and added tokens dropped).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dihal_fast.errors import DihalValueError

PROBE = "Hello world."  # a plain text every tokenizer encodes to ordinary tokens


@dataclass(frozen=True)
class TokenConvention:
    """How ``tokenizer``'s model saw documents: ids of the ``prefix`` and ``suffix`` of each document, the
    ``start`` a sample or prompt begins from (the prefix, else BOS, else EOS: a document boundary), and the
    ``control_ids`` (special and added tokens) that are never plain text."""

    tokenizer: Any
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    start: tuple[int, ...]
    control_ids: frozenset[int]

    def encode(self, text: str) -> list[int]:
        """The ids of a piece of text alone, without special tokens (the prefix and suffix are added per
        document)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` without the special and added tokens (``<bos>``, ``<start_of_image>``, ...)."""
        return self.tokenizer.decode([i for i in ids if i not in self.control_ids])

    def describe(self) -> str:
        """The convention in words, for a report's protocol: ``documents as `<bos> TEXT <eos>`: ...``."""
        tokens = self.tokenizer.convert_ids_to_tokens
        document = " ".join([*tokens(list(self.prefix)), "TEXT", *tokens(list(self.suffix))])
        bos = "the BOS the tokenizer adds" if self.prefix else "no BOS (the tokenizer adds none)"
        eos = "EOS after each document" if self.suffix else "no EOS (the tokenizer has none)"
        return f"documents as `{document}`: {bos}, {eos}; no chat template"


def token_convention(tokenizer) -> TokenConvention:
    """The :class:`TokenConvention` of ``tokenizer``, read from what ``tokenizer(text)`` adds to a plain text."""
    plain = tokenizer(PROBE, add_special_tokens=False)["input_ids"]
    full = tokenizer(PROBE)["input_ids"]
    at = next((i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), None)
    if not plain or at is None:
        raise DihalValueError(
            f"cannot tell the special tokens of the tokenizer {type(tokenizer).__name__}: {PROBE!r} encodes to "
            f"{full} with them and {plain} without"
        )
    prefix, suffix = tuple(full[:at]), tuple(full[at + len(plain) :])
    bos, eos = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None)
    if not suffix and eos is not None:
        suffix = (eos,)
    start = prefix or tuple(i for i in (bos if bos is not None else eos,) if i is not None)
    special = getattr(tokenizer, "all_special_ids", ())
    control = frozenset(special) | frozenset(getattr(tokenizer, "added_tokens_decoder", {}))
    return TokenConvention(tokenizer, prefix, suffix, start, control)
