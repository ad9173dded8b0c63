"""Mistake: g all-reduces in forward AND in backward.

This is what `torch.distributed.nn.functional.all_reduce` does (its backward all-reduces the
gradient too), so reaching for it as g is a real trap. Forward results are right; every
gradient upstream of g is t times too large, because g's output is already the same on every
rank and summing its gradient over ranks counts it t times.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_f_g": "g's backward must be the identity",
    "check_parallel_linears": "g's backward must be the identity",
    "check_tp_mlp": "g's backward must be the identity",
    "check_tp_attention": "g's backward must be the identity",
}


class CopyToTPRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromTPRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)  # wrong: a second all-reduce, in the backward
        return grad


def f(x):
    return CopyToTPRegion.apply(x)


def g(x):
    return ReduceFromTPRegion.apply(x)
