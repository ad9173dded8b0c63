"""Mistake: reduce_scatter_flat divides its input by t in place before reducing.

`grad /= t` gives the right mean, but it changes the caller's gradient tensor: whoever holds
it (a gradient hook, a bucket that is reused, a test) now sees a tensor divided by t.

Replaces reduce_scatter_flat (exercise 2).
"""

import torch
import torch.distributed as dist

CAUGHT_BY = {"check_flat_shards": "modified its input grad in place"}


def reduce_scatter_flat(grad):
    t = dist.get_world_size()
    grad /= t  # wrong: changes the caller's tensor
    parts = [part.contiguous() for part in grad.chunk(t)]
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts)
    return out
