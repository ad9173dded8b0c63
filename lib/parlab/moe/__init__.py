"""Mixture of experts and expert parallelism: module 06's references.

- `layer`: the router (`route`, `balance_loss`), capacity and drops, the single-device `MoE`.
- `dispatch`: dispatch and combine over an uneven `all_to_all_single` (`ep_moe`).
- `costs`: bytes of the expert-parallel all-to-all, flat against hierarchical; the rows a
  capacity or a dropless layer computes; the data-parallel sizes of dense and expert weights.
"""

from parlab.moe.costs import (
    a2a_cost,
    data_parallel_sizes,
    ep_a2a_bytes,
    expert_rows,
    uniform_remote_nodes,
)
from parlab.moe.dispatch import AllToAll, ExpertShard, all_to_all, ep_moe, ep_moe_capacity, owner
from parlab.moe.layer import (
    MoE,
    balance_loss,
    bias_update,
    expert_capacity,
    ffn,
    keep_mask,
    load_stats,
    moe_reference,
    queue_position,
    route,
)

__all__ = [
    "MoE", "route", "balance_loss", "expert_capacity", "keep_mask", "queue_position",
    "moe_reference", "ffn", "load_stats", "bias_update", "ExpertShard", "AllToAll", "all_to_all",
    "ep_moe", "ep_moe_capacity", "owner", "ep_a2a_bytes", "a2a_cost", "uniform_remote_nodes",
    "expert_rows", "data_parallel_sizes",
]
