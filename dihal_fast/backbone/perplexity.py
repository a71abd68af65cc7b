"""The backbone report's perplexity protocol: held-out NLL of a causal LM on a token stream, every token
after the first predicted once (:data:`dihal_fast.common.metrics.PROTOCOL` ``"stream_nll"``).

It differs from the block protocol of ``dihal evaluate`` (:func:`dihal_fast.common.metrics.token_nll`:
fixed blocks, the first token of each block unscored) on purpose: the stream protocol scores exactly the
tokens the unigram and bigram baselines score, so the three perplexities of a backbone report compare.
"""

from __future__ import annotations

import numpy as np
import torch

from dihal_fast.backbone.model import autocast_context
from dihal_fast.common.metrics import target_nll
from dihal_fast.errors import DihalValueError


@torch.no_grad()
def stream_nll(
    model, ids: np.ndarray, seq_len: int, batch_size: int = 8, max_windows: int | None = None, precision: str = "fp32"
) -> tuple[float, int]:
    """Summed NLL (nats) and count of predicted tokens of ``ids[1:]``.

    Window ``i`` is ``ids[i*S : i*S + S + 1]`` (consecutive windows share one token), so each token after
    the first is predicted exactly once with up to ``S`` tokens of context - the same tokens the unigram
    and bigram baselines score. ``max_windows`` limits the work for quick in-training estimates.
    """
    if len(ids) < 2:
        raise DihalValueError(f"need at least 2 tokens to evaluate, got {len(ids)}")
    device = next(model.parameters()).device
    stream = torch.from_numpy(np.asarray(ids, dtype=np.int64))
    starts = list(range(0, len(ids) - 1, seq_len))[:max_windows]
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for b in range(0, len(starts), batch_size):
            chunk = [stream[s : s + seq_len + 1] for s in starts[b : b + batch_size]]
            width = max(len(c) for c in chunk)
            inputs = torch.zeros(len(chunk), width - 1, dtype=torch.long)
            targets = torch.full((len(chunk), width - 1), -100, dtype=torch.long)
            for row, c in enumerate(chunk):
                inputs[row, : len(c) - 1], targets[row, : len(c) - 1] = c[:-1], c[1:]
            inputs, targets = inputs.to(device), targets.to(device)
            with autocast_context(precision, str(device)):
                logits = model(input_ids=inputs).logits
            scored = targets != -100
            total += float(target_nll(logits, targets.clamp_min(0), scored).sum())
            count += int(scored.sum())
    finally:
        model.train(was_training)
    return total, count
