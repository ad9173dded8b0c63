"""Mistake: reshard_after_forward left out, so the plan is never used.

FSDP2's default (None) reshards every unit but the root: right for a plan that reshards every
layer, wrong for one that keeps any.

Replaces shard_model (exercise 4).
"""

from torch import nn
from torch.distributed.fsdp import fully_shard

CAUGHT_BY = {"check_fully_shard": "the plan was not passed on"}


def shard_model(model, mesh, plan):
    for layer in [m for m in model.modules() if isinstance(m, nn.Linear)]:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model
