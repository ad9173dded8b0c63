"""Mistake: the LayerNorms left out of the plan; PrepareModuleInput takes their output as the
sequence shard it is.

The outputs are right (a LayerNorm acts token by token), but its weight and bias stay plain
tensors: each rank's gradient holds only its own tokens' share, never summed over the ranks
(the job of module 03's reduce_replicated_grads, which SequenceParallel does by making them
Replicate() DTensors).
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)

CAUGHT_BY = {"check_torch_sp": "SequenceParallel() on ln1 and ln2"}


def parallelize_sp(block, mesh):
    gathered = {"input_layouts": Shard(1), "desired_input_layouts": Replicate()}
    parallelize_module(block, mesh, {
        "attn": PrepareModuleInput(**gathered),
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
        "mlp": PrepareModuleInput(**gathered),
        "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(output_layouts=Shard(1))})
    block.attn.n_heads //= mesh.size()
    return block
