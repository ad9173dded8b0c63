"""Data parallelism and its sharded forms (modules 01 and 08).

- `ddp`: `BucketedDDP`, gradients averaged bucket by bucket, each bucket's all-reduce started
  from a hook during backward (overlap), with `no_sync()` for gradient accumulation (module 08).
- `zero1`: `ZeRO1`, AdamW with its state sharded over the group: reduce-scatter the gradients,
  update a slice, all-gather the parameters (module 08).
- `fsdp`: flat-parameter shards (`shard_bounds`, `take_shard`), the all-gather of weights and
  the reduce-scatter of gradients, `FSDPLinear`, and `plan_reshard` (keep or refetch per layer).
"""

from parlab.dp.ddp import Bucket, BucketedDDP, DDPStats, make_buckets
from parlab.dp.fsdp import (
    FSDPLinear,
    gather_flat_params,
    plan_reshard,
    reduce_scatter_flat_grads,
    reshard_bytes,
    shard_bounds,
    take_shard,
)
from parlab.dp.fsdp2 import (
    dim0_rows,
    gathered_numel,
    owners_dim0,
    owners_flat,
    shard_stack,
    step_bytes,
)
from parlab.dp.measure import StepMeasure, measure_step
from parlab.dp.zero1 import ZeRO1

__all__ = [
    "BucketedDDP", "Bucket", "DDPStats", "make_buckets", "ZeRO1",
    "shard_bounds", "take_shard", "gather_flat_params", "reduce_scatter_flat_grads", "FSDPLinear",
    "reshard_bytes", "plan_reshard", "dim0_rows", "gathered_numel", "step_bytes", "owners_flat",
    "owners_dim0", "shard_stack", "StepMeasure", "measure_step",
]
