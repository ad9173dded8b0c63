"""Exercise 6 with some of the plan's keys matched by wildcards ("ln*" for both norms, "*.proj"
and "*.fc2" for the projections out), the gathered input built once and shared by attn and
mlp, the heads told before the plan is applied, parallelize_module's return handed back."""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

PASSES = ["check_torch_sp"]


def parallelize_sp(block, mesh):
    block.attn.n_heads //= mesh.size()
    gathered = PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())
    return parallelize_module(block, mesh, {
        "ln*": SequenceParallel(), "attn": gathered, "mlp": gathered,
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "mlp.fc1": ColwiseParallel(),
        "*.proj": RowwiseParallel(output_layouts=Shard(1)),
        "*.fc2": RowwiseParallel(output_layouts=Shard(1))})
