"""The evaluation harness: every model (backbone, hybrids, controls) is scored on the same held-out
blocks and sampled with the same protocol, so their sections in ``evaluate.json`` are comparable."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import torch

from dihal_fast.common import metrics
from dihal_fast.common.devices import bridge_dtype_option
from dihal_fast.common.options import option
from dihal_fast.common.sampling import PROTOCOL as SAMPLING_PROTOCOL
from dihal_fast.common.validation import CheckedConfig
from dihal_fast.corpus import CorpusBlocks, token_convention
from dihal_fast.evaluate.generation import Generation
from dihal_fast.evaluate.scoring import GEN_PPL_PROTOCOL, generative_perplexity, teacher_forced

logger = logging.getLogger(__name__)

TIMING_REPEATS = 3  # identical sampling calls per model; tokens/s comes from the fastest


@dataclass
class EvalProtocolConfig(CheckedConfig):
    """What is measured and how much of it (saved in the report)."""

    seq_len: int = option(128, "tokens per held-out block", min=2)
    eval_blocks: int = option(32, "held-out blocks (the corpus tail) for NLL/PPL/KL", min=1)
    batch_size: int = option(8, "blocks per forward pass", min=1)
    n_samples: int = option(16, "samples per model for Gen PPL, entropy, diversity, speed", min=1)
    max_new_tokens: int = option(64, "tokens per sample", min=1)
    temperature: float = option(1.0, "sampling temperature", min=0.0)
    top_p: float = option(
        1.0, "nucleus sampling: draw from the most probable tokens holding this mass (1 = all)", gt=0.0, max=1.0
    )
    nfe: int | None = option(None, "denoising steps of hybrid bridges (default: each hybrid's own)", min=1)
    bridge_dtype: str | None = bridge_dtype_option("hybrid bridges")
    seed: int = option(0, "random seed")


def protocol(settings: EvalProtocolConfig, documents: str) -> dict:
    """The named protocol of a report: how every number in it was computed (``documents``: the special tokens of
    the corpus's documents, :meth:`~dihal_fast.corpus.TokenConvention.describe`)."""
    return {
        **metrics.PROTOCOL,
        "heldout": f"the last {settings.eval_blocks} blocks of {settings.seq_len} tokens of the corpus "
        "(documents joined into one token stream, no padding)",
        "documents": documents,
        "generation": f"{settings.n_samples} unconditional samples of {settings.max_new_tokens} tokens from the "
        f"start-of-document token, temperature {settings.temperature}, top-p {settings.top_p}, no early stop at EOS; "
        f"sampling: {SAMPLING_PROTOCOL}",
        "gen_ppl": GEN_PPL_PROTOCOL,
        "tokens_per_s": f"generated tokens / wall seconds of the whole sampling call (batch of all samples), "
        f"fastest of {TIMING_REPEATS} identical calls; same prompts, batch and hardware for every model",
    }


def heldout_blocks(tokenizer, corpus, settings: EvalProtocolConfig) -> CorpusBlocks:
    """The last ``eval_blocks`` blocks of ``seq_len`` tokens of the corpus (``.blocks``: ``LongTensor[N, seq_len]``)
    with the files they came from."""
    from dihal_fast.corpus import corpus_blocks, read_texts

    read = corpus_blocks(tokenizer, read_texts(corpus), settings.seq_len, required=True)
    if read.blocks.shape[0] < settings.eval_blocks:
        logger.warning(
            "corpus holds only %d blocks of %d tokens; evaluating on all of them",
            read.blocks.shape[0],
            settings.seq_len,
        )
    return read[-settings.eval_blocks :]


def sample_metrics(generation: Generation, tokenizer, evaluator) -> tuple[dict, list[str]]:
    """Gen PPL, entropy, both diversities and tokens/s of samples; also returns the decoded texts.

    ``evaluator`` is a :class:`~dihal_fast.evaluate.loaded_lm.LoadedLM`; entropy and diversity use its
    tokens of each sample so that all sample metrics share one tokenisation. A metric the samples do
    not define (every sample empty after decoding, no 4-grams) is ``None`` with the reason in ``notes``.
    """
    convention = token_convention(tokenizer)
    texts = [convention.decode(row) for row in generation.tokens.tolist()]
    section: dict = {
        "tokens_per_s": metrics.tokens_per_second(generation.tokens.numel(), generation.seconds),
        "sampling_seconds": generation.seconds,
        "notes": {},
    }
    try:
        gen = generative_perplexity(texts, evaluator.model, evaluator.tokenizer)
    except ValueError as exc:
        gen = {"token_ids": []}
        section["notes"]["gen_ppl"] = str(exc)
    token_ids = [ids for ids in gen.pop("token_ids") if ids]
    section["gen_ppl"] = gen.get("gen_ppl")
    section["gen_ppl_interval"] = gen.get("gen_ppl_interval")
    section["gen_ppl_details"] = gen
    for name, fn in (
        ("entropy", metrics.mean_unigram_entropy),
        ("diversity_dihal", metrics.diversity_dihal),
        ("diversity_ld4lg", metrics.diversity_ld4lg),
    ):
        try:
            section[name] = fn(token_ids)
        except ValueError as exc:
            section[name] = None
            section["notes"][name] = str(exc)
    return section, texts


def timed_sample(lm, prompt: torch.Tensor, settings: EvalProtocolConfig) -> Generation:
    """The samples of ``lm``, timed as the fastest of :data:`TIMING_REPEATS` identical calls (same seed, same
    tokens): the cost of sampling rather than of whatever else a shared machine ran during one call."""
    runs = [
        lm.sample(
            prompt,
            settings.max_new_tokens,
            settings.temperature,
            None,
            torch.Generator().manual_seed(settings.seed),
            top_p=settings.top_p,
        )
        for _ in range(TIMING_REPEATS)
    ]
    return Generation(runs[0].tokens, min(run.seconds for run in runs))


def evaluate_lm(
    lm, blocks: torch.Tensor, settings: EvalProtocolConfig, evaluator, reference=None
) -> tuple[dict, list[str]]:
    """One report section for a :class:`~dihal_fast.evaluate.loaded_lm.LoadedLM` and its sample texts.

    With ``reference`` (the backbone) the section's ``kl`` is KL(reference || lm); without, ``lm`` is the
    reference and its KL is 0 by definition.
    """
    scores = teacher_forced(
        lm.logits,
        blocks,
        settings.batch_size,
        reference=reference.logits if reference is not None else None,
        desc=f"scoring {lm.kind}",
    )
    scores.setdefault("kl", 0.0)
    prompt = torch.tensor([lm.prompt_ids("")]).expand(settings.n_samples, -1)
    generation = timed_sample(lm, prompt, settings)
    section, texts = sample_metrics(generation, lm.tokenizer, evaluator)
    return {"model": str(lm.path), "kind": lm.kind, **scores, **section}, texts


def report_header(settings: EvalProtocolConfig, heldout: CorpusBlocks, evaluator, documents: str) -> dict:
    """The fields every evaluation report starts with: the protocol, the settings, the corpus files with the tokens
    each gave the held-out blocks, the evaluator."""
    return {
        "protocol": protocol(settings, documents),
        "settings": asdict(settings),
        "corpus": heldout.files,
        "corpus_tokens": heldout.tokens_per_file(),
        "evaluator": {
            "path": str(evaluator.path),
            "dtype": str(next(evaluator.model.parameters()).dtype).replace("torch.", ""),
        },
    }
