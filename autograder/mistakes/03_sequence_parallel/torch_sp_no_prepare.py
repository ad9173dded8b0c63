"""Mistake: SequenceParallel on the LayerNorms, but no PrepareModuleInput before attention and
the MLP.

The numbers are right: SequenceParallel hands on a Shard(1) DTensor, and each ColwiseParallel
(q, k, v, fc1) gathers that sequence shard itself. Three all-gathers into attention where the
learner's SPBlock makes one, and, since each GEMM kept only the shard, all-gathers again in
backward.
"""

from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

CAUGHT_BY = {"check_torch_sp": "three all-gathers into attention where your SPBlock makes one"}


def parallelize_sp(block, mesh):
    parallelize_module(block, mesh, {
        "ln1": SequenceParallel(),
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
        "ln2": SequenceParallel(),
        "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(output_layouts=Shard(1))})
    block.attn.n_heads //= mesh.size()
    return block
