"""Mistake: the MLP left out of the plan.

The MLP runs whole on every rank: the numbers are right, nothing warns, and every rank holds
and computes all of fc1 and fc2, the memory and the GEMMs tensor parallelism splits.
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)

CAUGHT_BY = {"check_torch_tp": "the plan left this layer replicated"}


def parallelize_tp(model, mesh):
    for block in model.blocks:
        parallelize_module(block, mesh, {
            "attn": PrepareModuleInput(input_layouts=Replicate(),
                                       desired_input_layouts=Replicate()),
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel()})
        block.attn.n_heads //= mesh.size()
    return parallelize_module(model, mesh, {
        "tok": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
