"""Mistake: reduce_moe_grads averages the expert gradients over the dense group, like the rest.

The dense group holds the EP ranks, and the EP ranks of a group hold different experts: the
average mixes expert 0's gradient with expert 2's (same shapes, wrong values). An expert's
copies are the ranks with its ep coordinate, the expert group.

Replaces reduce_moe_grads (exercise 1d); fails the visible DP 2 × EP 2 check.
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_moe_grads": "mixes different experts' gradients"}


def reduce_moe_grads(dense, experts, groups):
    n = dist.get_world_size(groups["dense"])
    for p in dense + experts:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, group=groups["dense"])  # wrong for experts: other experts
        p.grad /= n
