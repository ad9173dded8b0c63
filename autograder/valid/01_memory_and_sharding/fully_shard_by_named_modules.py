"""Valid: the layers found through named_modules with a running index into the plan; the
whole gradients by redistributing each DTensor to Replicate() and taking the local tensor."""

from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate

PASSES = ["check_fully_shard"]


def shard_model(model, mesh, plan):
    i = 0
    for _, module in model.named_modules():
        if isinstance(module, nn.Linear):
            fully_shard(module, mesh=mesh, reshard_after_forward=bool(plan[i]))
            i += 1
    return fully_shard(model, mesh=mesh)


def full_grads(model):
    out = {}
    for name, p in model.named_parameters():
        out[name] = p.grad.redistribute(placements=[Replicate()]).to_local()
    return out
