"""Mistake: the plan applied to the layers from the last one back (as backward visits them).

plan[i] belongs to the i-th nn.Linear in forward order.

Replaces shard_model (exercise 4).
"""

from torch import nn
from torch.distributed.fsdp import fully_shard

CAUGHT_BY = {"check_fully_shard": "plan[i] belongs to the i-th nn.Linear"}


def shard_model(model, mesh, plan):
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for layer, reshard in zip(reversed(layers), plan, strict=True):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh)
    return model
