"""Mistake: sync_gradients divides the all-reduced gradients by 2, the DP size of the capstone.

Right on DP 2 × TP 2; on DP 4 × TP 1 (the visible check's second grid) the sum of four
gradients divided by 2 is twice the mean, on DP 3 (hidden) 1.5 times. The DP group's size is
dist.get_world_size(dp_group).

Replaces sync_gradients (exercise 4a); fails the visible check on DP 4 × TP 1.
"""

import torch.distributed as dist

CAUGHT_BY = {"check_sync_gradients": "not by a fixed 2"}


def sync_gradients(model, dp_group):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=dp_group)
            p.grad /= 2  # wrong: the DP group's size, not 2
