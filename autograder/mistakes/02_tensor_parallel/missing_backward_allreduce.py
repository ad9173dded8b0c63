"""Mistake: f with an identity backward (the missing all-reduce).

Replaces the exercise-1 answer (CopyToTPRegion, ReduceFromTPRegion, f, g); every later answer
of the solutions notebook then runs on top of it, as in a learner's notebook. Forward results
are right, but each rank's input gradient is only its own shard's term of dL/dx.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_f_g": "f's backward must all-reduce",
    "check_parallel_linears": "f's backward must all-reduce",
    "check_tp_mlp": "f's backward must all-reduce",
    "check_tp_attention": "f's backward must all-reduce",
}


class CopyToTPRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad  # wrong: the ranks' partial gradients are never summed


class ReduceFromTPRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def f(x):
    return CopyToTPRegion.apply(x)


def g(x):
    return ReduceFromTPRegion.apply(x)
