"""Mistake: the gradients are averaged over the whole world, not over the DP group.

Without group=, dist.all_reduce (and dist.get_world_size) use the default group: all dp·tp
ranks. The TP ranks of one DP replica hold different shards of the blocks, so mixing their
gradients is wrong (and averaging over 4 ranks, not 2, is wrong for the replicated ones too).

Replaces sync_gradients (exercise 4).
"""

import torch.distributed as dist

CAUGHT_BY = {"check_sync_gradients": "all-reduce over dp_group only"}


def sync_gradients(model, dp_group):
    d = dist.get_world_size()  # wrong: the world's size, 4, not the DP group's
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)  # wrong: no group=dp_group
            p.grad /= d
