"""Mistake: ColwiseParallel on the embedding, by analogy with the head.

On an nn.Embedding ColwiseParallel splits the hidden dimension (Shard(1)): each rank looks up
every word's vector and keeps C/t of its features, then all-gathers them. The numbers are
right, but every rank holds a slice of the whole table instead of its rows, which is not
the vocabulary-parallel embedding of exercise 7 (nor its bytes).
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)

CAUGHT_BY = {"check_torch_tp": "ColwiseParallel on nn.Embedding splits its hidden dimension"}


def parallelize_tp(model, mesh):
    for block in model.blocks:
        parallelize_module(block, mesh, {
            "attn": PrepareModuleInput(input_layouts=Replicate(),
                                       desired_input_layouts=Replicate()),
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(),
            "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()})
        block.attn.n_heads //= mesh.size()
    return parallelize_module(model, mesh, {
        "tok": ColwiseParallel(output_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
