"""Mistake: PrepareModuleInput told the input is already Replicate() (input_layouts misread as
"what the module wants"), with SequenceParallel on the norms.

PrepareModuleInput redistributes only when the layout it is told differs from the one wanted,
so the Shard(1) DTensor passes through as it is, and each ColwiseParallel gathers it for
itself: right numbers, module 02's three all-gathers into attention.
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

CAUGHT_BY = {"check_torch_sp": "three all-gathers into attention where your SPBlock makes one"}


def parallelize_sp(block, mesh):
    told = {"input_layouts": Replicate(), "desired_input_layouts": Replicate()}
    parallelize_module(block, mesh, {
        "ln1": SequenceParallel(), "attn": PrepareModuleInput(**told),
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
        "ln2": SequenceParallel(), "mlp": PrepareModuleInput(**told),
        "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(output_layouts=Shard(1))})
    block.attn.n_heads //= mesh.size()
    return block
