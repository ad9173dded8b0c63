"""Mistake: RowwiseParallel on fc1 and ColwiseParallel on fc2, the styles swapped.

fc1's weight is cut by columns and fc2's by rows; PyTorch fails on the first matrix product
("Sharding propagation failed"), far from the plan that caused it.
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)

CAUGHT_BY = {"check_torch_tp": "ColwiseParallel and RowwiseParallel swapped"}


def parallelize_tp(model, mesh):
    for block in model.blocks:
        parallelize_module(block, mesh, {
            "attn": PrepareModuleInput(input_layouts=Replicate(),
                                       desired_input_layouts=Replicate()),
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(),
            "mlp.fc1": RowwiseParallel(), "mlp.fc2": ColwiseParallel()})
        block.attn.n_heads //= mesh.size()
    return parallelize_module(model, mesh, {
        "tok": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
