"""Mistake: no PrepareModuleInput on the attention, as in PyTorch's tutorial for a plain MLP.

Outputs, loss and gradients are right; each ColwiseParallel of q, k and v wraps the block's
plain input as a Replicate DTensor of its own, so in backward each all-reduces the gradient it
sends back: three all-reduces per attention where the learner's TPAttention (its f) makes one.
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

CAUGHT_BY = {"check_torch_tp": "three all-reduces where your TPAttention's f makes one"}


def parallelize_tp(model, mesh):
    for block in model.blocks:
        parallelize_module(block, mesh, {
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(),
            "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()})
        block.attn.n_heads //= mesh.size()
    return parallelize_module(model, mesh, {
        "tok": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
