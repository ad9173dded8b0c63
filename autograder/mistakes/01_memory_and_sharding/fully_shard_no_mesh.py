"""Mistake: fully_shard called without mesh=.

FSDP2 then makes a one-dimensional mesh of the whole world: right when the data-parallel ranks
are the world (3 ranks, mesh (3,)), wrong on a (dp, tp) mesh, where each parameter is sharded
over all 4 ranks instead of its 2 data-parallel ones and averaged over the TP ranks too.

Replaces shard_model (exercise 4).
"""

from torch import nn
from torch.distributed.fsdp import fully_shard

CAUGHT_BY = {"check_fully_shard": "pass mesh=mesh to fully_shard"}
SIZES = {"check_fully_shard": (4,)}


def shard_model(model, mesh, plan):
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for layer, reshard in zip(layers, plan, strict=True):
        fully_shard(layer, reshard_after_forward=reshard)
    fully_shard(model)
    return model
