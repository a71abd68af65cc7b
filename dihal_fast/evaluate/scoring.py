"""Scoring text with language models: teacher-forced NLL/KL on token blocks, and generative perplexity
of samples under an evaluator LM."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch

from dihal_fast.common.hf_loading import input_device
from dihal_fast.common.metrics import perplexity, pooled_nll, token_kl, token_nll
from dihal_fast.common.progress import progress_bar
from dihal_fast.corpus import token_convention
from dihal_fast.errors import DihalValueError

logger = logging.getLogger(__name__)

LogitsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

GEN_PPL_PROTOCOL = (
    "samples decoded to text (special and added tokens dropped), retokenised by the evaluator tokenizer without "
    "special tokens; the evaluator's start-of-document token (the BOS its tokenizer adds, else its BOS, else its "
    "EOS) is prepended when it has one so every sample token is scored (otherwise the first token is unscored); "
    "truncated to the evaluator context; no EOS appended; "
    "gen_ppl = exp(token-pooled NLL over all samples); gen_ppl_per_sample = mean over samples of "
    "exp(per-sample mean NLL); gen_ppl_interval = the 2.5 and 97.5 percentiles of gen_ppl over 2,000 bootstrap "
    "draws of the samples with replacement (seed 0)"
)
INTERVAL_DRAWS = 2000


def pooled_interval(sums: Sequence[float], counts: Sequence[int], draws: int = INTERVAL_DRAWS) -> list[float]:
    """95 % bootstrap interval of ``exp(sum(sums) / sum(counts))`` over the samples (rows drawn with replacement;
    one NumPy generator of seed 0, so the same samples give the same interval)."""
    nll, tokens = np.asarray(sums, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    rows = np.random.default_rng(0).integers(0, len(nll), size=(draws, len(nll)))
    pooled = nll[rows].sum(axis=1) / tokens[rows].sum(axis=1)
    return [float(np.exp(q)) for q in np.quantile(pooled, [0.025, 0.975])]


def logits_fn(model) -> LogitsFn:
    """``(input_ids, attention_mask) -> logits`` for any model whose forward returns ``.logits``."""

    def run(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return model(input_ids=input_ids, attention_mask=attention_mask).logits

    return run


@torch.no_grad()
def teacher_forced(
    model: LogitsFn,
    blocks: torch.Tensor,
    batch_size: int = 8,
    reference: LogitsFn | None = None,
    desc: str = "scoring",
) -> dict:
    """Token-pooled NLL and PPL of ``model`` on ``LongTensor[N, T]`` blocks (no padding).

    With ``reference`` (the backbone), also the mean per-token ``KL(reference || model)`` on the same
    positions. Returns ``{nll, ppl, n_tokens[, kl]}``. ``model`` and ``reference`` put the blocks on their own
    devices (:meth:`~dihal_fast.evaluate.loaded_lm.LoadedLM.logits` does); the sums are taken where ``model``'s
    logits are.
    """
    if blocks.dim() != 2 or blocks.shape[0] == 0 or blocks.shape[1] < 2:
        raise DihalValueError(f"expected a non-empty LongTensor[N, T] of blocks with T >= 2, got {tuple(blocks.shape)}")
    if batch_size < 1:
        raise DihalValueError(f"batch_size must be >= 1, got {batch_size}")
    nll_sum, n_tokens, kl_sum = 0.0, 0, 0.0
    for start in progress_bar(range(0, blocks.shape[0], batch_size), desc=desc, leave=False):
        ids = blocks[start : start + batch_size]
        mask = torch.ones_like(ids)
        logits = model(ids, mask)
        ids, mask = ids.to(logits.device), mask.to(logits.device)
        batch_nll, batch_count = token_nll(logits, ids, mask)
        nll_sum += float(batch_nll.sum())
        n_tokens += int(batch_count.sum())
        if reference is not None:
            kl_sum += float(token_kl(reference(ids, mask).to(logits.device), logits, mask)[0].sum())
    nll = pooled_nll(nll_sum, n_tokens)
    out = {"nll": nll, "ppl": perplexity(nll), "n_tokens": n_tokens}
    if reference is not None:
        out["kl"] = kl_sum / n_tokens
    return out


def evaluator_context(model, tokenizer) -> int:
    """Longest sequence the evaluator accepts (config positions, else the tokenizer's limit)."""
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(model.config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < 10**7:
        return limit
    raise DihalValueError("cannot tell the evaluator's context length from its config or tokenizer")


@torch.no_grad()
def generative_perplexity(
    texts: Sequence[str], model, tokenizer, batch_size: int = 8, device: str | torch.device | None = None
) -> dict:
    """Gen PPL of sample texts under an evaluator causal LM, by :data:`GEN_PPL_PROTOCOL`, its inputs on ``device``
    (default: the evaluator's input embedding's device).

    Returns the pooled and per-sample Gen PPL, token counts, how many samples were truncated or
    empty after retokenisation, and ``token_ids`` (the evaluator tokens of each sample, used for
    entropy and diversity so that all three share one tokenisation).
    """
    if not texts:
        raise DihalValueError("no samples to score")
    context = evaluator_context(model, tokenizer)
    convention = token_convention(tokenizer)
    prefix = list(convention.start)
    keep = context - len(prefix)
    token_ids, n_truncated = [], 0
    for text in texts:
        ids = convention.encode(text)
        n_truncated += len(ids) > keep
        token_ids.append(ids[:keep])
    logger.info("scoring %d samples under the evaluator (context %d, %d truncated)", len(texts), context, n_truncated)
    scored = [(i, prefix + ids) for i, ids in enumerate(token_ids) if len(prefix + ids) >= 2]
    if not scored:
        raise DihalValueError(
            "every sample is empty (or one token without a BOS) after retokenisation; nothing to score"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = input_device(model) if device is None else device
    sample_sums: list[float] = []
    sample_counts: list[int] = []
    for start in range(0, len(scored), batch_size):
        batch = [ids for _, ids in scored[start : start + batch_size]]
        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            mask[row, : len(ids)] = 1
        input_ids, mask = input_ids.to(device), mask.to(device)
        logits = model(input_ids=input_ids, attention_mask=mask).logits
        sums, counts = token_nll(logits, input_ids.to(logits.device), mask.to(logits.device))
        sample_sums += sums.tolist()
        sample_counts += counts.tolist()
    count_total = int(sum(sample_counts))
    nll = pooled_nll(float(sum(sample_sums)), count_total)
    per_sample_nll = [total / count for total, count in zip(sample_sums, sample_counts)]
    return {
        "gen_ppl": perplexity(nll),
        "gen_nll": nll,
        "gen_ppl_interval": pooled_interval(sample_sums, sample_counts),
        "gen_ppl_per_sample": sum(perplexity(v) for v in per_sample_nll) / len(per_sample_nll),
        "n_samples": len(texts),
        "n_scored_tokens": count_total,
        "n_truncated": int(n_truncated),
        "n_empty": len(texts) - len(scored),
        "evaluator_context": context,
        "evaluator_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "protocol": GEN_PPL_PROTOCOL,
        "token_ids": token_ids,
    }
