"""Mistake: reduce_moe_grads divides by the world size instead of the dense group's size.

Dense gradients are averaged over the dense group (dp × ep × cp) and expert gradients summed
over the expert group, both divided by d·e·c, the number of losses averaged. Where pp = tp = 1
the world is exactly the dense group, so dist.get_world_size() gives the same d·e·c and the
answer passes; the visible test's EP 2 × TP 2 grid has a dense group of 2 in a world of 4, and
every gradient comes out half the single device's.

Replaces reduce_moe_grads (exercise 1d).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_moe_grads": "not by the world size"}


def reduce_moe_grads(dense, experts, groups):
    n = dist.get_world_size()  # wrong: the dense group's size, d·e·c
    for params, group in ((dense, groups["dense"]), (experts, groups["expert"])):
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=group)
            p.grad /= n
