"""The host memory a collection reaches at its peak, counted from what lives then: the process once the model is loaded
and the pass has read its weights (interpreter, libraries, weights), the token reservoir, the covariance
accumulators, one batch's activations with the copies of its collected rows, and the largest transient copy (a
checkpoint part, the sort of the reservoir, the merge of another process's state, the selection's working set).

On a GPU the activations and the accumulators live on the device: only their transient host copies count.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dihal_fast.collect.config import CollectConfig
from dihal_fast.common.hf_loading import DTYPES

MB = 2**20


def resident_bytes() -> int:
    """This process's resident memory now (``/proc/self/statm``; its peak so far where that is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_resident_bytes()


def peak_resident_bytes() -> int:
    """This process's peak resident memory so far (``ru_maxrss``, kilobytes on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of each part of a collection's peak host memory (see the module doc)."""

    process: int  # resident once the model's weights are (a safetensors load maps them: they arrive on first use)
    loaded_peak: int  # the peak so far (loading may pass through more, e.g. dequantizing a GGUF file)
    weights: int  # the model's parameters and buffers the pass reads (part of ``process`` on the CPU)
    reservoir: int
    covariances: int
    batch: int  # one forward pass's activations and the collected rows
    copies: int  # the largest transient copy after the collection loop

    @property
    def peak(self) -> int:
        """The most the process holds at once: what stays plus the larger of a batch and a transient copy."""
        grown = self.process + self.reservoir + self.covariances + max(self.batch, self.copies)
        return max(self.loaded_peak, grown)

    def describe(self) -> str:
        """One line: the peak and its parts in MB."""
        return (
            f"up to {self.peak / MB:.0f} MB of memory at the peak: the process {self.process / MB:.0f} (with the "
            f"{self.weights / MB:.0f} of weights the pass reads), the reservoir {self.reservoir / MB:.0f}, "
            f"covariances {self.covariances / MB:.0f}, a batch {self.batch / MB:.0f}, copies {self.copies / MB:.0f}"
        )


def tensor_bytes(module: torch.nn.Module) -> int:
    """Bytes of ``module``'s parameters and buffers (a tied tensor once)."""
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def embedding_bytes_read(embedding: torch.nn.Module, tokens: int | None) -> int:
    """Bytes of the input embedding a pass over ``tokens`` tokens makes resident when its table is mapped from a file
    (a safetensors load): at most one row and one page per token, and never more than the table. A 262,144-row
    vocabulary is mostly never read; ``tokens`` None (a pass over the whole corpus) counts the whole table."""
    table = tensor_bytes(embedding)
    rows = int(getattr(embedding, "num_embeddings", 0) or 0)
    if tokens is None or rows == 0:
        return table
    return min(table, tokens * (table // rows + os.sysconf("SC_PAGE_SIZE")))


def estimate_memory(
    model: torch.nn.Module,
    before_load: int,
    config: CollectConfig,
    states: int,
    unread: Sequence[torch.nn.Module] | None,
    selection: int = 0,
) -> MemoryEstimate:
    """The :class:`MemoryEstimate` of collecting ``states`` hidden states of ``model`` as ``config`` says, the process
    having held ``before_load`` bytes before loading it. ``unread``: the decoder blocks above the deepest collected one,
    which a stopped pass never runs (``None``: a whole pass, holding every hidden state); ``selection``: the bytes the
    selection needs afterwards. Weights are counted as the pass reads them: a safetensors load maps the file, and a
    page becomes resident when first read (of the input embedding, only the rows of the tokens it embeds)."""
    dim = int(model.config.hidden_size)
    heads = int(getattr(model.config, "num_attention_heads", 1) or 1)
    inner = int(getattr(model.config, "intermediate_size", None) or getattr(model.config, "n_inner", None) or 4 * dim)
    embedding = model.get_input_embeddings()
    weights = tensor_bytes(model.base_model) - sum(tensor_bytes(block) for block in unread or ())
    weights -= tensor_bytes(embedding) - embedding_bytes_read(embedding, config.max_tokens)
    forward_states = states if unread is not None else int(model.config.num_hidden_layers) + 1
    on_host = next(model.parameters()).device.type == "cpu"
    itemsize, tokens = DTYPES[config.dtype].itemsize, config.batch_size * config.seq_len
    layer = config.reservoir_size * dim * itemsize  # one state's vectors in the reservoir
    reservoir = config.reservoir_size * 24 + states * layer  # with each token's key, position and id
    square = dim * dim * 8  # a float64 D x D matrix
    covariances = states * (square + dim * 8) if on_host else 0
    activations = tokens * itemsize * ((forward_states + states) * dim + 3 * inner + 4 * dim)
    attention = tokens * heads * config.seq_len * itemsize
    batch = activations + attention + 2 * square if on_host else states * tokens * dim * 4
    merge = 2 * (reservoir + states * square) if config.world_size > 1 else 0
    copies = max(layer, 3 * square, merge, selection)
    process = max(resident_bytes(), before_load + weights if on_host else 0)
    return MemoryEstimate(process, peak_resident_bytes(), weights, reservoir, covariances, batch, copies)
