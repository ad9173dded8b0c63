"""Mistake: reshard_after_forward read backwards, `not plan[i]`.

plan[i] is True for a layer to reshard (free after forward, gather again in backward), which
is what reshard_after_forward=True means: inverting it keeps the layers the plan frees and
frees the ones it keeps.

Replaces shard_model (exercise 4).
"""

from torch import nn
from torch.distributed.fsdp import fully_shard

CAUGHT_BY = {"check_fully_shard": "reshard_after_forward misread"}


def shard_model(model, mesh, plan):
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for layer, reshard in zip(layers, plan, strict=True):
        fully_shard(layer, mesh=mesh, reshard_after_forward=not reshard)
    fully_shard(model, mesh=mesh)
    return model
