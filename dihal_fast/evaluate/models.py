"""One interface over the two kinds of language model this package evaluates: a plain Hugging Face
backbone and a DiHAL hybrid directory (``dihal_fast.hybrid.HybridLM``)."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from dihal_fast.common.models import load_causal_lm, resolve_model_dir
from dihal_fast.evaluate.generation import Generation, check_generation_request, sample_causal_lm
from dihal_fast.evaluate.scoring import evaluator_context

logger = logging.getLogger(__name__)


@dataclass
class LoadedLM:
    """A model ready to score and sample: ``kind`` is ``"backbone"`` or ``"hybrid"``."""

    kind: str
    path: Path
    model: torch.nn.Module
    tokenizer: object
    backbone_dir: Path
    context: int
    nfe: int | None = None

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``[B, T, V]`` next-token logits (a hybrid's bridge runs ``nfe`` denoising steps; None = its default)."""
        if self.kind == "hybrid":
            return self.model(input_ids, attention_mask=attention_mask, nfe=self.nfe).logits
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def prompt_ids(self, prompt: str) -> list[int]:
        """A prompt's token ids: the start-of-document token (BOS, else EOS) then the text's tokens,
        the way the backbone saw documents in training."""
        start = self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self.tokenizer.eos_token_id
        ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return ([start] if start is not None else []) + ids

    def sample(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        nfe: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Generation:
        """``max_new_tokens`` sampled after each row of ``prompt_ids[B, P]`` (float64 categorical draws)."""
        check_generation_request(prompt_ids.shape[1], prompt_ids.shape[0], max_new_tokens, self.context)
        if self.kind == "hybrid":
            from dihal_fast.evaluate.hybrid_adapter import sample_hybrid

            return sample_hybrid(self.model, prompt_ids, max_new_tokens, temperature, top_k, nfe, generator)
        if nfe is not None:
            raise ValueError("--nfe (denoising steps) applies to hybrid models only; this is a plain backbone")
        return sample_causal_lm(self.model, prompt_ids, max_new_tokens, temperature, top_k, generator)


def load_lm(path: str | os.PathLike | None, dtype: str = "float32", device: str = "cpu", nfe: int | None = None) -> LoadedLM:
    """A backbone checkpoint directory, a hybrid directory or a ``dihal replace`` run directory
    (``None`` = the shipped backbone); ``nfe`` sets a hybrid's denoising steps for scoring."""
    from dihal_fast.evaluate.hybrid_adapter import find_hybrid_dir, load_hybrid

    if path is not None:
        hybrid_dir = find_hybrid_dir(Path(path))
        if hybrid_dir is not None:
            model, tokenizer, backbone_dir = load_hybrid(hybrid_dir, device)
            logger.info("loaded the hybrid in %s (layer %d of %s)", hybrid_dir, model.config.layer, backbone_dir)
            context = evaluator_context(model, tokenizer)
            return LoadedLM("hybrid", hybrid_dir, model, tokenizer, backbone_dir, context, nfe)
    model_dir = resolve_model_dir(path)
    model, tokenizer = load_causal_lm(model_dir, dtype=dtype, device=device)
    logger.info("loaded the causal LM in %s (%s)", model_dir, dtype)
    return LoadedLM("backbone", model_dir, model, tokenizer, model_dir, evaluator_context(model, tokenizer))


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers map text to the same ids (same vocabulary and special tokens)."""
    return a.get_vocab() == b.get_vocab() and a.all_special_ids == b.all_special_ids
