"""Mistake: the head's output Replicate() (Megatron's gather_output), a DTensor as loss_parallel
wants, but not sharded over the vocabulary.

The head all-gathers all V logits on every rank, and loss_parallel refuses them ("requires
exactly one mesh dim to shard tensor dimension").
"""

from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)

CAUGHT_BY = {"check_torch_tp": "loss_parallel needs the logits sharded over the vocabulary"}


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
        "tok": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Replicate(), use_local_output=False)})
