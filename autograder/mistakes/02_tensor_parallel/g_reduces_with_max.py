"""Mistake: g's forward all-reduces with op=MAX instead of summing.

The check used to give rank r an input of r everywhere: on 2 ranks the maximum of 0 and 1 is
also their sum, so this g passed the visible test and failed only the hidden ones on 3 ranks.
With random whole numbers, different on every rank and in every entry, the maximum is not the
sum on any number of ranks; every layer built on g would add nothing up.

Replaces f and g (exercise 1); f is right.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {
    "check_f_g": "g's forward all-reduced with op=MAX",
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
        dist.all_reduce(x, op=dist.ReduceOp.MAX)  # wrong: the partial sums must be added
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def f(x):
    return CopyToTPRegion.apply(x)


def g(x):
    return ReduceFromTPRegion.apply(x)
