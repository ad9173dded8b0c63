"""Mistake: the attention's n_heads left at the model's 12 heads.

Under ColwiseParallel q, k and v hold this rank's C/t features, and attention splits them into
n_heads heads of C/(t n_heads) features each: every head t times too narrow. With 48 features,
12 heads and t = 3, 16 features split into 12 heads do not fit and PyTorch fails on the reshape;
with t = 2, 24 features split into 12 heads of 2 do, and the numbers are silently wrong.
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)

CAUGHT_BY = {"check_torch_tp": "must be told its heads per rank"}


def parallelize_tp(model, mesh):
    for block in model.blocks:
        parallelize_module(block, mesh, {
            "attn": PrepareModuleInput(input_layouts=Replicate(),
                                       desired_input_layouts=Replicate()),
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(),
            "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()})
    return parallelize_module(model, mesh, {
        "tok": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
