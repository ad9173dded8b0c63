"""Mistake: keep_mask marks the dropped assignments in the routing it was given.

Writing -1 into `experts` where a choice is dropped looks handy, but the caller still needs
its routing (the layer sends every kept choice to experts[i, j]'s rank), and the next call
sees -1 where an expert id was. The mask is right; the input is not what it was.

Replaces keep_mask (exercise 2; expert_capacity, in the same cell, is right).
"""

import math

import torch.nn.functional as F

CAUGHT_BY = {"check_capacity": "your code modified its input experts"}


def expert_capacity(n_tokens, num_experts, k, capacity_factor):
    return math.ceil(capacity_factor * n_tokens * k / num_experts)


def keep_mask(experts, num_experts, capacity):
    n, k = experts.shape
    order = experts.t().flatten()
    onehot = F.one_hot(order, num_experts)
    before = (onehot.cumsum(dim=0) * onehot).sum(dim=1) - 1
    keep = (before < capacity).view(k, n).t()
    experts[~keep] = -1  # wrong: modifies the caller's routing in place
    return keep
