"""Mistake: the model sharded in place, nothing returned.

fully_shard changes the module in place and returns it; shard_model must hand the model back.

Replaces shard_model (exercise 4).
"""

from torch import nn
from torch.distributed.fsdp import fully_shard

CAUGHT_BY = {"check_fully_shard": "fully_shard shards the module in place and returns it"}


def shard_model(model, mesh, plan):
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for layer, reshard in zip(layers, plan, strict=True):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh)
