"""Mistake: the gradients are summed over the DP group, not averaged.

Each DP rank's gradient is the mean over its share of the batch; the single-device gradient is
the mean over the whole batch, i.e. the mean of the DP ranks' gradients. An all-reduce sums
them: divide by the DP group's size afterwards. Adam hides the factor d (it divides every
gradient by its own size), plain SGD does not.

Replaces sync_gradients (exercise 4).
"""

import torch.distributed as dist

CAUGHT_BY = {"check_sync_gradients": "divide by the DP group's size after the all-reduce"}


def sync_gradients(model, dp_group):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=dp_group)  # wrong: a sum, never divided by d
