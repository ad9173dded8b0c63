"""Exercise 6 with every layout spelled out: PrepareModuleInput given tuples and
use_local_output=False, one shared by attn and mlp; SequenceParallel(sequence_dim=1) on both
norms by a wildcard ("ln*"), in a call of their own; ColwiseParallel's Replicate() input and
RowwiseParallel's Shard(-1) input; the heads set before the plan, parallelize_module's return
handed back."""

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
    block.attn.n_heads = block.attn.n_heads // mesh.size()
    parallelize_module(block, mesh, {"ln*": SequenceParallel(sequence_dim=1)})
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                use_local_output=False)
    column = ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1))
    row = RowwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(1), use_local_output=True)
    return parallelize_module(block, mesh, {
        "attn": gather, "attn.q": column, "attn.k": column, "attn.v": column, "attn.proj": row,
        "mlp": gather, "mlp.fc1": column, "mlp.fc2": row})
