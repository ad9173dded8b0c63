"""Mistake: the attention's n_heads left at the layer's 12 heads (module 02's pitfall, under SP).

q, k and v hold C/t features per rank; split into 12 heads each is t times too narrow: with
48 features and t = 2, 12 heads of 2 features fit and the output is silently wrong.
"""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

CAUGHT_BY = {"check_torch_sp": "must be told its heads per rank"}


def parallelize_sp(block, mesh):
    gathered = {"input_layouts": Shard(1), "desired_input_layouts": Replicate()}
    parallelize_module(block, mesh, {
        "ln1": SequenceParallel(), "attn": PrepareModuleInput(**gathered),
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
        "ln2": SequenceParallel(), "mlp": PrepareModuleInput(**gathered),
        "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(output_layouts=Shard(1))})
    return block
