"""Mistake: module 02's RowwiseParallel() on proj and fc2, without output_layouts=Shard(1).

Their outputs are all-reduced to all T tokens, the residual holds this rank's T/t: the
addition fails ("The size of tensor a ... must match the size of tensor b").
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

CAUGHT_BY = {"check_torch_sp": "the tokens do not line up"}


def parallelize_sp(block, mesh):
    gathered = {"input_layouts": Shard(1), "desired_input_layouts": Replicate()}
    parallelize_module(block, mesh, {
        "ln1": SequenceParallel(), "attn": PrepareModuleInput(**gathered),
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "attn.proj": RowwiseParallel(),
        "ln2": SequenceParallel(), "mlp": PrepareModuleInput(**gathered),
        "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()})
    block.attn.n_heads //= mesh.size()
    return block
