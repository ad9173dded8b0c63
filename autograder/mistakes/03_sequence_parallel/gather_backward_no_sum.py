"""Mistake: the all-gather's backward keeps this rank's rows of the gradient without summing.

After the gather every rank's tensor-parallel shard (its heads, its ffn columns) uses all T
tokens, so each rank holds a partial gradient of every token. Keeping one's own rows drops
the other ranks' terms: the forward is right, the input gradient is not.

Replaces GatherFromSequenceParallelRegion (exercise 1).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_sp_pair": "the all-gather's backward must reduce-scatter",
    "check_sp_block": "look at the backward of your gather and reduce-scatter",
}


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return all_gather_sequence(x)  # noqa: F821 - the learner's exercise-1 helper

    @staticmethod
    def backward(ctx, grad):
        rank, t = dist.get_rank(), dist.get_world_size()
        n = grad.shape[1] // t
        return grad[:, rank * n:(rank + 1) * n].contiguous()  # wrong: no sum over ranks
