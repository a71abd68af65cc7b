"""Validation of a hybrid on held-out blocks: the bridge loss (the number the layer sweep ranks layers by)
and teacher-forced NLL / PPL / KL of the hybrid against its backbone on the same tokens."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dihal_fast.common.metrics import PROTOCOL, perplexity, pooled_nll, token_kl, token_nll
from dihal_fast.errors import DihalValueError
from dihal_fast.hybrid import HybridLM, backbone_targets
from dihal_fast.replace.statistics import Teacher

BRIDGE_LOSS_PROTOCOL = (
    "mean over held-out tokens and dimensions of ((h_hat - h) / std)^2, h_hat sampled by the bridge "
    "(its sampler and nfe, noise seeded per position), std = sqrt(mean per-dimension variance of the "
    "teacher's h_l on training blocks): the fraction of h_l's variance left unexplained (1 = predicting the mean)"
)


@torch.no_grad()
def validation_bridge_loss(
    hybrid: HybridLM,
    backbone: nn.Module,
    blocks: Tensor,
    batch_size: int = 8,
    nfe: int | None = None,
    sampler: str | None = None,
    seed: int = 0,
    teacher: Teacher | None = None,
) -> dict:
    """Bridge loss, hybrid and backbone NLL/PPL and KL(backbone || hybrid) on ``blocks`` ``(N, T)`` (``teacher``:
    where the backbone's targets come from, default ``backbone_targets`` of ``backbone``).

    Runs on the device of ``hybrid``'s input embedding (where its bridge is); ``backbone`` must be the checkpoint
    the hybrid was cut from.
    """
    if blocks.dim() != 2 or blocks.shape[0] == 0:
        raise DihalValueError(f"validation blocks must be a non-empty (N, T) tensor, got {tuple(blocks.shape)}")
    hybrid.eval()
    device = hybrid.get_input_embeddings().weight.device
    layer, bridge = hybrid.config.layer, hybrid.bridge
    squared, count = torch.zeros((), dtype=torch.float64), 0
    sums = {"hybrid": [], "backbone": [], "kl": []}
    for start in range(0, blocks.shape[0], batch_size):
        ids = blocks[start : start + batch_size].to(device)
        hidden, teacher_logits = teacher(ids, layer) if teacher is not None else backbone_targets(backbone, ids, layer)
        out = hybrid(ids, nfe=nfe, sampler=sampler, seed=seed + start)
        error = (out.bridge_hidden_state.float() - hidden.float()) / bridge.target_std  # over the scalar std
        squared += error.double().pow(2).sum().cpu()
        count += error.numel()
        sums["hybrid"].append(token_nll(out.logits, ids))
        sums["backbone"].append(token_nll(teacher_logits, ids))
        sums["kl"].append(token_kl(teacher_logits, out.logits))
    report = {"bridge_loss": float(squared / count)}
    for name in ("hybrid", "backbone"):
        nll = pooled_nll(torch.cat([s for s, _ in sums[name]]), torch.cat([n for _, n in sums[name]]))
        report[f"{name}_nll"], report[f"{name}_ppl"] = nll, perplexity(nll)
    report["kl"] = pooled_nll(torch.cat([s for s, _ in sums["kl"]]), torch.cat([n for _, n in sums["kl"]]))
    report.update(
        {
            "ppl_ratio": report["hybrid_ppl"] / report["backbone_ppl"],
            "blocks": int(blocks.shape[0]),
            "tokens": int(blocks.numel()),
            "nfe": nfe or bridge.config.nfe,
            "sampler": sampler or bridge.config.sampler,
            "seed": seed,
            "protocol": {"bridge_loss": BRIDGE_LOSS_PROTOCOL, "nll": PROTOCOL["nll"], "kl": PROTOCOL["kl"]},
        }
    )
    return report
