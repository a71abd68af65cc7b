"""One interface over every language model this package evaluates: a Hugging Face backbone, a DiHAL hybrid
directory (a transformers model too, ``dihal_fast.hybrid.HybridLM``) and the controls. Scoring is
``model(input_ids, attention_mask).logits`` and sampling ``model.generate(...)`` with the float64 protocol,
the same calls for all of them."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dihal_fast.common import read_json
from dihal_fast.common.hf_loading import input_device, load_causal_lm, resolve_model_dir
from dihal_fast.corpus import token_convention
from dihal_fast.errors import DihalValueError
from dihal_fast.evaluate.generation import Generation, check_generation_request
from dihal_fast.evaluate.scoring import evaluator_context

logger = logging.getLogger(__name__)

HYBRID_MODEL_TYPE = "dihal_hybrid"
RESULT_NAME = "result.json"  # the summary `dihal replace` writes in its run directory


@dataclass
class LoadedLM:
    """A model ready to score and sample; ``kind`` (``"backbone"`` / ``"hybrid"``) labels reports only."""

    kind: str
    path: Path
    model: torch.nn.Module
    tokenizer: object
    context: int

    @property
    def backbone_dir(self) -> Path:
        """The checkpoint a hybrid was cut from (provenance recorded in its config); a backbone's own path."""
        recorded = getattr(self.model.config, "backbone_dir", "")
        return Path(recorded) if recorded else self.path

    @property
    def device(self) -> torch.device:
        """Where the model's inputs go (its input embedding's device; the first device of a spread model)."""
        return input_device(self.model)

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``[B, T, V]`` next-token logits (inputs moved to :attr:`device`; the logits stay where the model made
        them)."""
        return self.model(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device)).logits

    def prompt_ids(self, prompt: str) -> list[int]:
        """A prompt's token ids: the start-of-document token (the BOS the tokenizer adds, else its BOS, else its
        EOS; :class:`~dihal_fast.corpus.TokenConvention`) then the text's tokens, as the backbone saw documents."""
        convention = token_convention(self.tokenizer)
        return [*convention.start, *convention.encode(prompt)]

    @torch.inference_mode()
    def sample(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        top_p: float = 1.0,
        stop_at_eos: bool = False,
    ) -> Generation:
        """Continuations of each row of ``prompt_ids[B, P]`` by ``model.generate`` with float64 draws, timed.

        Without ``stop_at_eos`` exactly ``max_new_tokens`` are drawn per row; with it a row ends at its first
        EOS and is padded after it (``pad_token_id``) to the longest row. The prompt moves to :attr:`device`; the
        draws come from ``generator`` (a CPU one gives the same tokens on every device).
        """
        from dihal_fast.hybrid.generation import float64_sampling

        check_generation_request(prompt_ids.shape[1], prompt_ids.shape[0], max_new_tokens, self.context)
        eos = self.tokenizer.eos_token_id if stop_at_eos else None
        prompt_ids = prompt_ids.to(self.device)
        start = time.perf_counter()
        out = self.model.generate(
            prompt_ids,
            attention_mask=torch.ones_like(prompt_ids),
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            pad_token_id=self.tokenizer.pad_token_id,
            **float64_sampling(temperature, top_k, top_p, generator),
        )
        return Generation(out[:, prompt_ids.shape[1] :], time.perf_counter() - start)


def is_hybrid_dir(path: Path) -> bool:
    """Whether ``path`` holds a saved hybrid (a ``config.json`` of model type ``dihal_hybrid``)."""
    from dihal_fast.hybrid.legacy import check_not_legacy

    if path.is_dir():
        check_not_legacy(path)
    config = path / "config.json"
    data = read_json(config, "model config") if config.is_file() else None
    return isinstance(data, dict) and data.get("model_type") == HYBRID_MODEL_TYPE


def replace_run(path: Path) -> tuple[Path, Path | None]:
    """``(hybrid directory, backbone or None)`` of a ``dihal replace`` run directory, from its ``result.json``
    (a relative ``hybrid_dir`` is relative to the run); refused in one line when it names no existing hybrid."""
    result = read_json(path / RESULT_NAME, "bridge training summary (dihal replace)")
    named = result.get("hybrid_dir") if isinstance(result, dict) else None
    if not isinstance(named, str) or not named:
        raise DihalValueError(
            f"{path / RESULT_NAME} names no hybrid (no 'hybrid_dir'): pass the hybrid directory itself as --hybrid"
        )
    hybrid = path / named
    if not is_hybrid_dir(hybrid):
        raise DihalValueError(
            f"{path / RESULT_NAME} names the hybrid {hybrid}, which holds no saved hybrid (was the run moved? pass "
            "the hybrid directory itself as --hybrid)"
        )
    backbone = result.get("model")
    return hybrid, Path(backbone) if isinstance(backbone, str) and backbone else None


def check_bridge_options(hybrid: bool, nfe: int | None, bridge_dtype: str | None) -> None:
    """Refuse (one line) bridge options for a model that is not a hybrid."""
    if not hybrid and (nfe, bridge_dtype) != (None, None):
        flag = "--nfe (denoising steps)" if nfe is not None else "--bridge-dtype"
        raise DihalValueError(f"{flag} applies to hybrid models only; this is a plain causal LM")


def configure_bridge(model: torch.nn.Module, nfe: int | None, bridge_dtype: str | None = None) -> None:
    """Make ``nfe`` the default denoising steps of a hybrid's bridge and run it in ``bridge_dtype``
    (:meth:`~dihal_fast.hybrid.HybridLM.use_bridge_dtype`); None keeps the hybrid's own."""
    bridge = getattr(model, "bridge", None)
    check_bridge_options(bridge is not None, nfe, bridge_dtype)
    if bridge is None:
        return
    if nfe is not None:
        if nfe < 1:
            raise DihalValueError(f"--nfe must be >= 1, got {nfe}")
        bridge.config.nfe = int(nfe)
    if bridge_dtype is not None:
        model.use_bridge_dtype(bridge_dtype)


def load_lm(
    path: str | os.PathLike | None,
    dtype: str = "auto",
    device: str = "cpu",
    nfe: int | None = None,
    device_map: str = "none",
    bridge_dtype: str | None = None,
) -> LoadedLM:
    """A backbone checkpoint directory, a hybrid directory or a ``dihal replace`` run directory (``None`` = the
    shipped backbone), in ``dtype`` (``auto`` = the checkpoint's) on ``device`` (``auto``: cuda when torch sees one),
    or spread by ``device_map`` (:func:`dihal_fast.common.hf_loading.placement`); ``nfe`` and ``bridge_dtype`` set
    a hybrid's denoising steps and bridge dtype (:func:`configure_bridge`)."""
    import dihal_fast.hybrid  # noqa: F401  (registers the hybrid with the Auto classes)

    if path is not None and not is_hybrid_dir(Path(path)) and (Path(path) / RESULT_NAME).is_file():
        path = replace_run(Path(path))[0]
    model_dir = resolve_model_dir(path)
    check_bridge_options(is_hybrid_dir(Path(model_dir)), nfe, bridge_dtype)  # before the load
    # the bridge dtype is a from_pretrained keyword: applied while loading, so a float32 bridge is never rounded
    options = {"bridge_dtype": bridge_dtype} if bridge_dtype is not None else {}
    model, tokenizer = load_causal_lm(model_dir, dtype=dtype, device=device, device_map=device_map, **options)
    configure_bridge(model, nfe)
    kind = "hybrid" if model.config.model_type == HYBRID_MODEL_TYPE else "backbone"
    logger.info("loaded the %s in %s (%s on %s)", kind, model_dir, model.dtype, describe_placement(model))
    return LoadedLM(kind, model_dir, model, tokenizer, evaluator_context(model, tokenizer))


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers map text to the same ids (same vocabulary and special tokens)."""
    return a.get_vocab() == b.get_vocab() and a.all_special_ids == b.all_special_ids


def describe_placement(model) -> str:
    """``cpu``, ``cuda:0``, or the devices of a spread model with their share of its parameters
    (``cuda:0 52%, cuda:1 48%``), for logs and reports."""
    counts: dict[str, int] = {}
    for parameter in model.parameters():
        counts[str(parameter.device)] = counts.get(str(parameter.device), 0) + parameter.numel()
    if len(counts) == 1:
        return next(iter(counts))
    total = sum(counts.values())
    return ", ".join(f"{name} {100 * n / total:.0f}%" for name, n in counts.items())
