"""Mistake: the expert gradients are averaged over the expert group (divided by d·c), not
summed over it and divided by the dense group's d·e·c.

Each rank's expert gradient already sums what the tokens of all e EP ranks sent it through
the all-to-all; the average over its d·c copies is then e times the single device's.

Replaces reduce_moe_grads (exercise 1d); fails the visible DP 2 × EP 2 check (2 times too
large).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_moe_grads": "not by the expert group's d·c"}


def reduce_moe_grads(dense, experts, groups):
    for params, group in ((dense, groups["dense"]), (experts, groups["expert"])):
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=group)
            p.grad /= dist.get_world_size(group)  # wrong for experts: d·c, not d·e·c
