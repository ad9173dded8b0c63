"""What `check_fully_shard` (module 01, exercise 4) tells a learner: the likely mistake behind
each way an FSDP2 model can differ from what the plan asks, in one place."""

from __future__ import annotations

__all__ = ["FSDP2_WHAT", "SHARD", "RETURN", "NO_MESH", "ROOT_ONLY", "NO_ROOT", "INVERTED",
           "IGNORED", "REVERSED", "PLAN", "DTENSOR", "LOCAL", "FULL", "REPLICATE"]

FSDP2_WHAT = "parlab.dp.fsdp2.shard_stack (the course's fully_shard of a stack of layers)"
SHARD = ("for each nn.Linear of the model, in order: fully_shard(layer, mesh=mesh, "
         "reshard_after_forward=plan[i]); then fully_shard(model, mesh=mesh) for the root")
RETURN = "fully_shard shards the module in place and returns it: return the model"
NO_MESH = ("pass mesh=mesh to fully_shard: without it FSDP2 shards over every rank of the "
           "world, not over the data-parallel ranks of the mesh you were given")
ROOT_ONLY = ("fully_shard was applied at the root only: one unit holds every layer, so one "
             "all-gather brings all the weights at once, and the root keeps them until "
             "backward (its default is not to reshard). fully_shard each nn.Linear first, "
             "then the root")
NO_ROOT = ("the model itself was not fully_shard'ed: every layer is then a root of its own, "
           "and FSDP2 can neither prefetch the next layer's all-gather in backward nor "
           "overlap a reduce-scatter with the next layer's compute. After the layers, call "
           "fully_shard(model, mesh=mesh)")
INVERTED = ("reshard_after_forward misread: True frees the gathered weights after forward "
            "(resharded) and gathers them again in backward; False keeps them resident. "
            "plan[i] is True for a layer to reshard: pass it as it is, not `not plan[i]`")
IGNORED = ("the plan was not passed on: with reshard_after_forward left out, FSDP2 reshards "
           "every unit but the root. Give each layer's fully_shard "
           "reshard_after_forward=plan[i]")
REVERSED = ("plan[i] belongs to the i-th nn.Linear in the order the model runs them (the "
            "order of model.modules()); the plan was applied to other layers")
PLAN = ("reshard_after_forward=plan[i] for the i-th nn.Linear: True reshards after forward, "
        "False keeps the gathered weights until backward")
DTENSOR = ("FSDP2's gradients are DTensors, like its parameters: p.grad is this rank's "
           "Shard(0) piece wrapped as a distributed tensor. p.grad.full_tensor() all-gathers "
           "the whole gradient as a plain tensor")
LOCAL = ("that is this rank's Shard(0) rows, p.grad.to_local(): a plain tensor, but only a "
         "piece; the whole gradient is p.grad.full_tensor() (an all-gather over the mesh)")
FULL = ("return {name: p.grad.full_tensor() for name, p in model.named_parameters()}: the "
        "gradient every rank agrees on, the mean over the data-parallel ranks")
REPLICATE = ("FSDP2 shards every parameter along dim 0: placement Shard(0) on the "
             "data-parallel mesh; leave fully_shard's sharding as it is")
