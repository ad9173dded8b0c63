"""Mistake: reduce_moe_grads skips the parameters whose .grad is None, as sync_gradients does.

An expert that got no token on this rank has no gradient here, but its copy on the other
DP replica has one and all-reduces it over the expert group: this rank never posts that
all-reduce, and its copy waits for it (the launcher stops the run: a certain hang).

Replaces reduce_moe_grads (exercise 1d); fails the visible DP 2 × EP 2 check, where rank 0's
experts get no token.
"""

import torch.distributed as dist

CAUGHT_BY = {"check_moe_grads": "give it zeros"}


def reduce_moe_grads(dense, experts, groups):
    n = dist.get_world_size(groups["dense"])
    for params, group in ((dense, groups["dense"]), (experts, groups["expert"])):
        for p in params:
            if p.grad is None:  # wrong: its copies on other ranks do reduce it
                continue
            dist.all_reduce(p.grad, group=group)
            p.grad /= n
