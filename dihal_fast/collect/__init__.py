"""Streaming collection of every layer's hidden states: exact covariance + a mergeable token sample.

    from dihal_fast.collect import CollectConfig, collect
    result = collect(CollectConfig(model="ckpt/", corpus=["text.txt"], max_tokens=100_000), "runs/x")
    result.statistics.covariances[3].covariance      # D x D, float64, over every token
    result.statistics.reservoir.sorted().layer_vectors(3)   # n x D sampled hidden states of layer 3

Memory grows with layers x D^2 (+ the reservoir), never with the number of tokens; a run is
checkpointed, resumable, and can be spread over processes with ``torchrun``.
"""

from dihal_fast.collect.config import CollectConfig
from dihal_fast.collect.distributed import distributed_session, merge_to_rank0, rank_info
from dihal_fast.collect.reservoir import TokenReservoir, token_keys
from dihal_fast.collect.run import CollectResult, collect, model_hidden_states
from dihal_fast.collect.shards import write_shards
from dihal_fast.collect.state_store import CheckpointStore, remove_collection_state
from dihal_fast.collect.statistics import LayerStatistics, token_mask

__all__ = [
    "CheckpointStore",
    "CollectConfig",
    "CollectResult",
    "LayerStatistics",
    "TokenReservoir",
    "collect",
    "distributed_session",
    "merge_to_rank0",
    "model_hidden_states",
    "rank_info",
    "remove_collection_state",
    "token_keys",
    "token_mask",
    "write_shards",
]
