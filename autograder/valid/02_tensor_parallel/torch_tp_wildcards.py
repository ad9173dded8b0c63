"""Exercise 9 with wildcard keys ("blocks.*.attn.q", which parallelize_module expands), every
layout spelled out (tuples for PrepareModuleInput, ColwiseParallel's Replicate() input), the
model's parts in two calls, and the loss returned detached as a plain tensor."""

import torch.nn.functional as F
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
    parallelize_module(model, mesh, {
        "blocks.*.attn": PrepareModuleInput(input_layouts=(Replicate(),),
                                            desired_input_layouts=(Replicate(),),
                                            use_local_output=False),
        "blocks.*.attn.q": ColwiseParallel(**column), "blocks.*.attn.k": ColwiseParallel(**column),
        "blocks.*.attn.v": ColwiseParallel(**column), "blocks.*.attn.proj": RowwiseParallel(**row),
        "blocks.*.mlp.fc1": ColwiseParallel(**column), "blocks.*.mlp.fc2": RowwiseParallel(**row)})
    for block in model.blocks:
        block.attn.n_heads = block.attn.n_heads // mesh.size()
    parallelize_module(model, mesh, {
        "tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "head": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1),
                                use_local_output=False)})
    return model


def tp_loss(logits, target):
    with loss_parallel():
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="mean")
        loss.backward()
    return loss.to_local().detach()
