"""Mistake: the capacity is rounded to the nearest whole number instead of up.

c = ceil(phi N k / E). round() agrees whenever the product is whole, or its fraction is over
one half (2.75 -> 3), which is every case but one of the checks' sizes before fractional ones
were added; at 4.5 (Python rounds half to even: 4) or 2.25 (2) a slot is missing and one more
assignment is dropped than the rule says.

Replaces expert_capacity (exercise 2; keep_mask, in the same cell, is right).
"""

import torch.nn.functional as F

CAUGHT_BY = {"check_capacity": "rounded to the nearest"}


def expert_capacity(n_tokens, num_experts, k, capacity_factor):
    return round(capacity_factor * n_tokens * k / num_experts)  # wrong: rounds, not ceil


def keep_mask(experts, num_experts, capacity):
    n, k = experts.shape
    order = experts.t().flatten()
    onehot = F.one_hot(order, num_experts)
    before = (onehot.cumsum(dim=0) * onehot).sum(dim=1) - 1
    return (before < capacity).view(k, n).t()
