"""Exercise 9 as one plan for the whole model, applied from the root: wildcard keys
("blocks.*.attn.q", which parallelize_module expands to every block), every layout spelled out
(tuples for PrepareModuleInput, ColwiseParallel's Replicate() input); the heads set before the
plan; the loss through nn.CrossEntropyLoss on logits viewed as (B S, V), returned as a plain
tensor."""

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    loss_parallel,
    parallelize_module,
)

PASSES = ["check_torch_tp"]


def parallelize_tp(model, mesh):
    column = {"input_layouts": Replicate(), "output_layouts": Shard(-1)}
    row = {"input_layouts": Shard(-1), "output_layouts": Replicate()}
    for block in model.blocks:
        block.attn.n_heads = block.attn.n_heads // mesh.size()
    parallelize_module(model, mesh, {
        "tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "blocks.*.attn": PrepareModuleInput(input_layouts=(Replicate(),),
                                            desired_input_layouts=(Replicate(),),
                                            use_local_output=False),
        "blocks.*.attn.q": ColwiseParallel(**column), "blocks.*.attn.k": ColwiseParallel(**column),
        "blocks.*.attn.v": ColwiseParallel(**column), "blocks.*.attn.proj": RowwiseParallel(**row),
        "blocks.*.mlp.fc1": ColwiseParallel(**column), "blocks.*.mlp.fc2": RowwiseParallel(**row),
        "head": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1),
                                use_local_output=False)})
    return model


def tp_loss(logits, target):
    vocab = logits.shape[-1]
    with loss_parallel():
        loss = nn.CrossEntropyLoss()(logits.reshape(-1, vocab), target.reshape(-1))
        loss.backward()
    return loss.to_local().detach()
