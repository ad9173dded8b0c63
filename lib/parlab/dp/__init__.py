"""Data parallelism and its sharded forms: module 01's FSDP-style layer and reshard planner.

- `fsdp`: flat-parameter shards (`shard_bounds`, `take_shard`), the all-gather of weights and
  the reduce-scatter of gradients, `FSDPLinear`, and `plan_reshard` (keep or refetch per layer).
"""

from parlab.dp.fsdp import (
    FSDPLinear,
    gather_flat_params,
    plan_reshard,
    reduce_scatter_flat_grads,
    reshard_bytes,
    shard_bounds,
    take_shard,
)

__all__ = [
    "shard_bounds", "take_shard", "gather_flat_params", "reduce_scatter_flat_grads", "FSDPLinear",
    "reshard_bytes", "plan_reshard",
]
