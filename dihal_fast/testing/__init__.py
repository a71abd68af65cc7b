"""Helpers for tests and examples (tiny random checkpoints); not used by the pipeline itself."""

from dihal_fast.testing.tiny import FAMILIES, make_tiny_checkpoint, make_tiny_tokenizer

__all__ = ["FAMILIES", "make_tiny_checkpoint", "make_tiny_tokenizer"]
