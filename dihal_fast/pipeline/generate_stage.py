"""The generate stage: samples from a hybrid or a plain backbone through ``model.generate``, every token drawn in
float64 (:func:`dihal_fast.hybrid.float64_sampling`).

``generate(GenerateConfig(model=..., prompt=[...]), out=None)`` samples ``n_samples`` continuations of
every prompt and, with ``out``, writes them with their protocol as JSON.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from dihal_fast.common.devices import bridge_dtype_option, device_map_option, device_option, dtype_option
from dihal_fast.common.options import option
from dihal_fast.common.validation import CheckedConfig
from dihal_fast.errors import DihalValueError
from dihal_fast.pipeline.reports import GenerateReport

logger = logging.getLogger(__name__)


@dataclass
class GenerateConfig(CheckedConfig):
    """The model, the prompts and the sampling settings."""

    model: str | None = option(
        None, "hybrid directory, replace run directory or HF checkpoint directory (default: the shipped backbone)"
    )
    prompt: list[str] | None = option(
        None, "prompt text; repeat the option for several prompts (default: one empty prompt)", action="append"
    )
    n_samples: int = option(3, "samples per prompt", min=1)
    max_new_tokens: int = option(48, "tokens generated after the prompt", min=1)
    nfe: int | None = option(None, "denoising steps of a hybrid's bridge (default: the hybrid's own setting)", min=1)
    bridge_dtype: str | None = bridge_dtype_option()
    do_sample: bool = option(True, "draw tokens at random (--no-do-sample: greedy, always the most likely token)")
    temperature: float = option(1.0, "sampling temperature (0 = greedy)", min=0.0)
    top_k: int | None = option(None, "sample only among the k most likely tokens", min=1)
    top_p: float = option(
        1.0, "nucleus sampling: only among the most likely tokens holding this much probability", gt=0.0, max=1.0
    )
    stop_at_eos: bool = option(True, "end a sample at its first EOS token (--no-stop-at-eos: always max-new-tokens)")
    seed: int = option(0, "random seed")
    device: str = device_option()
    dtype: str = dtype_option()
    device_map: str = device_map_option()


def generate_texts(
    lm,
    prompts: list[str],
    n_samples: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    stop_at_eos: bool = True,
    seed: int = 0,
) -> dict:
    """Samples for every prompt: ``{"samples": [{prompt, text, token_ids}], "tokens_per_s", "seconds"}``
    (``token_ids`` end at the first EOS, which they include, with ``stop_at_eos``)."""
    import torch

    from dihal_fast.common.metrics import tokens_per_second
    from dihal_fast.corpus import token_convention

    generator = torch.Generator().manual_seed(seed)
    eos, convention = lm.tokenizer.eos_token_id, token_convention(lm.tokenizer)
    samples, seconds, n_tokens = [], 0.0, 0
    for prompt in prompts:
        ids = torch.tensor([lm.prompt_ids(prompt)], device=lm.device)
        out = lm.sample(ids.expand(n_samples, -1), max_new_tokens, temperature, top_k, generator, top_p, stop_at_eos)
        seconds += out.seconds
        for row in out.tokens.tolist():
            if stop_at_eos and eos in row:
                row = row[: row.index(eos) + 1]
            n_tokens += len(row)
            samples.append({"prompt": prompt, "text": convention.decode(row), "token_ids": row})
    return {"samples": samples, "seconds": seconds, "tokens_per_s": tokens_per_second(n_tokens, seconds)}


def generate(config: GenerateConfig, out: str | Path | None = None) -> GenerateReport:
    """Sample from ``config.model``; with ``out`` (a file, checked before any work) also write the samples,
    the settings and the protocol there as JSON."""
    import torch

    from dihal_fast.common import atomic_write_json, resolve_device
    from dihal_fast.common.rundir import check_output_file
    from dihal_fast.common.sampling import PROTOCOL
    from dihal_fast.evaluate.loaded_lm import load_lm

    torch.manual_seed(config.seed)
    if config.n_samples < 1:
        raise DihalValueError(f"--n-samples must be >= 1, got {config.n_samples}")
    device = str(resolve_device(config.device))
    if out is not None:
        out = check_output_file(out)
    lm = load_lm(config.model, config.dtype, device, config.nfe, config.device_map, config.bridge_dtype)
    logger.info("sampling %d x %d tokens from the %s at %s", config.n_samples, config.max_new_tokens, lm.kind, lm.path)
    temperature = config.temperature if config.do_sample else 0.0
    result = generate_texts(
        lm,
        list(config.prompt or [""]),
        config.n_samples,
        config.max_new_tokens,
        temperature,
        config.top_k,
        config.top_p,
        config.stop_at_eos,
        config.seed,
    )
    stop = "a sample ends at its first EOS" if config.stop_at_eos else "no early stop at EOS"
    report = {
        "model": str(lm.path),
        "kind": lm.kind,
        "seed": config.seed,
        "nfe": config.nfe,
        "bridge_dtype": getattr(lm.model.config, "bridge_dtype", None),
        "temperature": temperature,
        "top_k": config.top_k,
        "top_p": config.top_p,
        "stop_at_eos": config.stop_at_eos,
        "protocol": f"{stop}; prompt = start-of-document token + prompt tokens; tokens/s = generated tokens / "
        f"wall time of the sampling calls; {PROTOCOL}",
        **result,
    }
    if out is not None:
        atomic_write_json(out, report)
    return GenerateReport(out, report)
