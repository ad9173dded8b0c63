"""Mistake: fully_shard applied to the root only.

Every parameter is still a Shard(0) DTensor and the numbers are right, but the model is one
unit: one all-gather brings every layer's weights before the first layer runs, and the root,
which FSDP2 does not reshard after forward by default, keeps them all until backward: the
whole model resident, whatever the plan.

Replaces shard_model (exercise 4).
"""

from torch.distributed.fsdp import fully_shard

CAUGHT_BY = {"check_fully_shard": "fully_shard was applied at the root only"}


def shard_model(model, mesh, plan):
    fully_shard(model, mesh=mesh)
    return model
