"""Mistake: SequenceParallel(use_local_output=True) on the LayerNorms and no PrepareModuleInput.

The LayerNorm's output reaches q, k and v as a plain (B, T/t, C) tensor, which ColwiseParallel
takes for the whole replicated input: attention runs on this rank's T/t tokens alone, and the
reduce-scatter after it leaves a T/t^2 slice that does not fit the residual ("The size of
tensor a ... must match").
"""

from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

CAUGHT_BY = {"check_torch_sp": "the tokens do not line up"}


def parallelize_sp(block, mesh):
    parallelize_module(block, mesh, {
        "ln1": SequenceParallel(use_local_output=True),
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
        "ln2": SequenceParallel(use_local_output=True),
        "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(output_layouts=Shard(1))})
    block.attn.n_heads //= mesh.size()
    return block
