"""Graded checks of module 01, "Memory and sharding".

- `state`: exercise 1, `check_state_bytes(state_bytes, practice)`: bytes per device of each
  data-parallel strategy, and the 70B practice problem.
- `shards`: exercise 2, first test, `check_flat_shards(take_shard, all_gather_flat,
  reduce_scatter_flat)`: the flat shard and its two collectives.
- `layer`: exercise 2, `check_fsdp_layer(FSDPLinear)`: an FSDP-style layer against a DDP step
  (it builds on the three helpers, and says so when their test failed).
- `reshard`: exercise 3, `check_reshard_plan(plan_reshard)`: keep or refetch per layer.
- `fully_shard` (with `fully_shard_worker`, the rank's half, and `fully_shard_hints`): exercise
  4, `check_fully_shard(shard_model, full_grads)`: PyTorch's FSDP2 on a stack of layers with a
  reshard plan, against a DDP step, its bytes and the layers it keeps.
- `common`: the references the checks refuse, and small helpers.

    from parlab.check import fsdp as fsdpcheck
    fsdpcheck.check_fsdp_layer(FSDPLinear, world_size=2)
"""

from parlab.check.fsdp.fully_shard import check_fully_shard
from parlab.check.fsdp.layer import check_fsdp_layer
from parlab.check.fsdp.reshard import check_reshard_plan
from parlab.check.fsdp.shards import check_flat_shards
from parlab.check.fsdp.state import check_state_bytes
from parlab.errors import CheckFailed

__all__ = ["check_state_bytes", "check_flat_shards", "check_fsdp_layer", "check_reshard_plan",
           "check_fully_shard", "CheckFailed"]
